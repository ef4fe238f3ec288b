"""Prompt queue order and re-queueing, and the settings' per-role budgets (failure labels: ``tests/unit/test_retry.py``)."""

from __future__ import annotations

from recipes.datasets import PromptRecord
from services.rollout.config import RolloutSettings
from services.rollout.producer import PromptQueue

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


def test_budgets_per_role():
    s = RolloutSettings.load(max_turns=5, executor_max_turns=2, max_tokens_per_turn=64)
    budgets = s.budgets()
    assert budgets["planner"].max_turns == 5 and budgets["executor"].max_turns == 2
    assert budgets["policy"].max_tokens == 64 and budgets["worker"].max_turns == 1
    assert RolloutSettings.load(agent="coda").metric == "f1" and s.metric == "em"
