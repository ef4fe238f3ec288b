"""Prompt queue order and re-queueing, failure labels, and the settings' per-role budgets."""

from __future__ import annotations

import httpx

from recipes.datasets import PromptRecord
from services.rollout.config import RolloutSettings
from services.rollout.producer import PromptQueue, failure_cause
from shared.inference_client import InferenceError

RECORDS = [PromptRecord(prompt_id=f"p{i}", question=f"q{i}", golden_answers=["a"]) for i in range(3)]


def test_queue_epochs_and_requeue_first():
    q = PromptQueue(RECORDS, seed=1, epochs=2)
    first = [q.next().prompt_id for _ in range(3)]
    assert sorted(first) == ["p0", "p1", "p2"]
    failed = RECORDS[0]
    assert q.requeue(failed, max_failures=2)
    assert q.next() is failed  # retried before new prompts
    assert not q.requeue(failed, max_failures=2)  # second failure: dropped
    assert sorted(q.next().prompt_id for _ in range(3)) == ["p0", "p1", "p2"]
    assert q.next() is None  # two epochs done


def test_failure_causes_name_the_service():
    services = {"inference": "http://127.0.0.1:8002", "retriever": "http://127.0.0.1:8000", "searcher": ""}
    req = httpx.Request("POST", "http://127.0.0.1:8000/retrieve")
    assert failure_cause(httpx.ConnectError("refused", request=req), services) == "retriever_unreachable"
    assert failure_cause(httpx.ReadTimeout("slow", request=req), services) == "retriever_timeout"
    resp = httpx.Response(503, request=req)
    assert failure_cause(httpx.HTTPStatusError("x", request=req, response=resp), services) == "retriever_http_503"
    assert failure_cause(InferenceError(500, "boom"), services) == "inference_http_500"
    assert failure_cause(ValueError("x"), services) == "ValueError"


def test_budgets_per_role():
    s = RolloutSettings.load(max_turns=5, executor_max_turns=2, max_tokens_per_turn=64)
    budgets = s.budgets()
    assert budgets["planner"].max_turns == 5 and budgets["executor"].max_turns == 2
    assert budgets["policy"].max_tokens == 64 and budgets["worker"].max_turns == 1
    assert RolloutSettings.load(agent="coda").metric == "f1" and s.metric == "em"
