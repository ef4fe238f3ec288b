"""Which failures are outages, the gate's backoff and bookkeeping, and the prompt queue's counting."""

from __future__ import annotations

import time

from recipes.datasets import PromptRecord
from services.rollout.metrics import RolloutMetrics
from services.rollout.outage import DependencyGate, outage_dependency
from services.rollout.producer import PromptQueue


def test_outages_name_their_dependency_and_the_prompts_own_failures_none():
    assert outage_dependency("retriever_unreachable") == "retriever"
    assert outage_dependency("retriever_timeout") == "retriever"
    assert outage_dependency("inference_http_503") == "inference"
    assert outage_dependency("inference_http_504") == "inference"
    assert outage_dependency("inference_http_429") == "inference"
    assert outage_dependency("searcher_http_502") == "searcher"
    assert outage_dependency("redis_error") == "redis"
    for own in (
        "inference_http_404",
        "retriever_http_400",
        "inference_http_500",
        "retriever_http_500",
        "http_unreachable",
        "ValueError",
        "KeyError",
    ):
        assert outage_dependency(own) is None, own


def sample(metrics: RolloutMetrics, name: str, labels: dict | None = None) -> float | None:
    return metrics.registry.get_sample_value(name, labels or {})


async def test_gate_probes_with_capped_exponential_backoff_then_resumes():
    metrics = RolloutMetrics()
    answers = iter([False] * 5 + [True])
    seen: list[float] = []

    async def probe(dependency: str) -> bool:
        assert dependency == "retriever"
        seen.append(gate._delay)
        return next(answers)

    gate = DependencyGate(probe, metrics, first_s=0.001, max_s=0.004)
    await gate.wait()  # no outage: returns at once
    assert seen == []
    gate.down("retriever", "retriever_unreachable", time.perf_counter())
    gate.down("inference", "inference_timeout", time.perf_counter())  # already paused: one outage, one log
    assert gate.status()["waiting_for"] == "retriever" and gate.status()["outage_cause"] == "retriever_unreachable"
    assert sample(metrics, "coda_rollout_waiting_for_dependency", {"dependency": "retriever"}) == 1.0
    await gate.wait()
    assert seen == [0.002, 0.004, 0.004, 0.004, 0.004, 0.004]  # the delay after each sleep: doubled, capped
    assert gate.status() == {"waiting_for": None, "outage_cause": None, "outage_s": None}
    assert sample(metrics, "coda_rollout_waiting_for_dependency", {"dependency": "retriever"}) == 0.0
    assert sample(metrics, "coda_rollout_dependency_outages_total", {"dependency": "retriever"}) == 1.0
    assert sample(metrics, "coda_rollout_dependency_outages_total", {"dependency": "inference"}) is None


async def test_stragglers_of_a_past_outage_do_not_pause_again_and_success_resets_the_backoff():
    async def probe(dependency: str) -> bool:
        return True

    gate = DependencyGate(probe, RolloutMetrics(), first_s=0.001, max_s=0.004)
    before = time.perf_counter()
    gate.down("retriever", "retriever_http_503", before)
    await gate.wait()
    gate.down("retriever", "retriever_http_503", before)  # a group started during the outage, failing late
    assert gate.waiting_for is None
    assert gate._delay == 0.002  # kept until a group succeeds: a flapping dependency is probed less often
    gate.ok()
    assert gate._delay == 0.001
    gate.down("retriever", "retriever_http_503", time.perf_counter())  # a new outage
    assert gate.waiting_for == "retriever"


def test_queue_counts_only_the_prompts_own_failures_and_forgets_them_on_success():
    record = PromptRecord(prompt_id="p0", question="q0", golden_answers=["a"])
    q = PromptQueue([record], seed=0)
    q.put_back(record)  # an outage: back first, uncounted
    assert q.next() is record and not q.attempts
    assert q.requeue(record, max_failures=2)
    q.succeeded(record)
    assert not q.attempts
    assert q.requeue(record, max_failures=2)  # one failure since the success: not dropped yet
    assert not q.requeue(record, max_failures=2)
