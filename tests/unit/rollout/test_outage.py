"""Which failures are outages, the gate's backoff and bookkeeping, and the prompt queue's counting."""

from __future__ import annotations

import time

import aiohttp
import httpx
import redis

from agents.datasets import PromptRecord
from services.rollout.admission import DependencyGate, outage_dependency
from services.rollout.metrics import RolloutMetrics
from services.rollout.producer import PromptQueue
from shared.inference_client import InferenceError
from shared.retry import classify

SERVICES = {"inference": "http://llm:8002", "retriever": "http://retriever:8000", "searcher": "http://searcher:8001"}


def _status(url: str, status: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", url)
    return httpx.HTTPStatusError("x", request=request, response=httpx.Response(status, request=request))


def test_outages_name_their_dependency_and_the_prompts_own_failures_none():
    retrieve = httpx.Request("POST", "http://retriever:8000/retrieve")
    outages = {
        httpx.ConnectError("refused", request=retrieve): "retriever",
        httpx.ReadTimeout("slow", request=retrieve): "retriever",
        InferenceError(503, "loading"): "inference",
        InferenceError(504, "gateway"): "inference",
        InferenceError(429, "busy"): "inference",
        aiohttp.ServerDisconnectedError(): "inference",
        TimeoutError(): "inference",
        _status("http://searcher:8001/search", 502): "searcher",
        redis.ConnectionError("refused"): "redis",
        redis.ResponseError("OOM command not allowed"): "redis",  # publishing fails alike for every prompt
    }
    for exc, dependency in outages.items():
        assert outage_dependency(classify(exc, SERVICES)) == dependency, exc
    for own in (
        InferenceError(404, "no adapter"),
        InferenceError(500, "this prompt crashed the server"),
        _status("http://retriever:8000/retrieve", 400),
        _status("http://retriever:8000/retrieve", 500),
        httpx.ConnectError("refused", request=httpx.Request("GET", "http://elsewhere/x")),  # nothing to probe
        httpx.UnsupportedProtocol("no scheme", request=retrieve),  # a wrong URL fails the same way every time
        ValueError("reward bug"),
        KeyError("x"),
    ):
        assert outage_dependency(classify(own, SERVICES)) is None, own


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
