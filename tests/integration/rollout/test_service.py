"""The rollout service end to end against a scripted LLM, the real retriever and a real Redis:
published messages, admission under a held version, the weight follower, failures and recovery."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import redis
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from agents.datasets import load_prompts
from agents.prompts import CharTokenizer
from services.rollout.admission import Admission
from services.rollout.app import build_app
from services.rollout.embedding import hashing_embed
from services.rollout.metrics import RolloutMetrics
from services.rollout.producer import Producer, PromptQueue
from services.rollout.runtime import agent_context
from shared.protocol import TrajectoryGroup, WeightUpdate
from shared.redis_server import free_port
from shared.stream import StreamQueue
from testing.serving import ThreadedServer

TOK = CharTokenizer()


def read_groups(client, count: int = 100) -> list[TrajectoryGroup]:
    queue = StreamQueue(client, "trajectories", TrajectoryGroup, group="check", consumer="t")
    queue.ensure_group()
    return [e.message for e in queue.read(count=count)]


def wait_for(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


def check_coda_group(group: TrajectoryGroup, n: int) -> None:
    planners = [s for s in group.samples if s.role == "planner"]
    executors = [s for s in group.samples if s.role == "executor"]
    assert len(planners) == n and executors
    by_id = {s.sample_id: s for s in group.samples}
    for ex in executors:
        assert by_id[ex.parent_id].role == "planner"
        # Per-role rewards (CoDA's default): each executor carries its own, scored against its task's target.
        assert (
            "executor_score" in ex.reward_components and "executor_score" not in by_id[ex.parent_id].reward_components
        )
    for s in group.samples:
        trained = TOK.decode([t for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m])
        inserted = TOK.decode(
            [t for t, m in zip(s.token_ids[s.prompt_len :], s.loss_mask[s.prompt_len :], strict=True) if not m]
        )
        assert "<documents>" not in trained and "<result>" not in trained and "Doc 1(" not in trained
        assert ("<documents>" in inserted) if s.role == "executor" else ("<result>" in inserted)
        assert all(lp < 0 for lp, m in zip(s.logprobs, s.loss_mask, strict=True) if m)
        assert "answer_f1" in s.reward_components  # the episode's answer metrics reach every sample
        assert ("planner_format" in s.reward_components) == (s.role == "planner")


@pytest.mark.parametrize("scope", ["process", "redis"])
def test_app_publishes_groups_and_admission_follows_versions(scope, fake_llm, make_settings, redis_client):
    settings = make_settings(fake_llm.url, agent="coda", max_staleness=0, groups_per_step=2, admission_scope=scope)
    with ThreadedServer(build_app(settings)) as url:
        wait_for(lambda: redis_client.xlen("trajectories") >= 2)
        time.sleep(0.5)
        assert redis_client.xlen("trajectories") == 2  # (0 + 0 + 1) · 2 with the version held still
        status = httpx.get(f"{url}/status").json()
        assert status["admission"]["capacity"] == 0 and status["published"] == 2
        # the trainer publishes version 1 as a LoRA adapter
        fake_llm.loras["policy-v1"] = "/w/1"
        StreamQueue(redis_client, "weights", WeightUpdate).publish(
            WeightUpdate(version=1, kind="lora", model_name="policy-v1", path="/w/1", step=1, created_at=time.time())
        )
        redis_client.set("policy:version", 1)
        wait_for(lambda: redis_client.xlen("trajectories") >= 4)
        time.sleep(0.5)
        assert redis_client.xlen("trajectories") == 4
        assert httpx.get(f"{url}/health").status_code == 200
        metrics = httpx.get(f"{url}/metrics").text
        assert 'coda_rollout_episodes_total{recipe="coda"} 8.0' in metrics
        assert "coda_rollout_staleness_versions_bucket" in metrics
    groups = read_groups(redis_client)
    assert [g.policy_version for g in groups] == [0, 0, 1, 1]
    assert len({g.group_id for g in groups}) == 4
    for group in groups:
        check_coda_group(group, n=2)
    late = [s for g in groups[2:] for s in g.samples]
    assert all(v == 1 for s in late for v, m in zip(s.versions, s.loss_mask, strict=True) if m)
    assert {c.model for c in fake_llm.calls[-4:]} == {"policy-v1"}


async def run_producer(settings, redis_client, max_groups: int, publisher=None) -> Producer:
    async with agent_context(settings, tok=TOK) as ctx:
        producer = Producer(
            settings,
            ctx,
            client=redis_client,
            embed=hashing_embed,
            metrics=RolloutMetrics(),
            publisher=publisher or StreamQueue(redis_client, "trajectories", TrajectoryGroup),
            admission=Admission(5, 10, max_running=settings.max_running_groups),
            prompts=PromptQueue(load_prompts(settings.dataset), seed=0),
        )
        await asyncio.wait_for(producer.run(max_groups=max_groups), 60)
        return producer


async def test_llm_500_is_not_retried_and_counts_against_the_prompt_which_is_requeued(
    fake_llm, make_settings, redis_client
):
    settings = make_settings(fake_llm.url, agent="search-r1", n_samples=1, max_running_groups=1, retry_attempts=3)
    fake_llm.fail_next(1)  # a 500: this request failed (shared.retry), sending it again would not help
    producer = await run_producer(settings, redis_client, max_groups=2)
    assert fake_llm.requests == 1 + len(fake_llm.calls)  # the failing call was tried once
    assert producer.failures == {"inference_http_500": 1} and producer.stats.published == 1
    assert producer.status()["blamed_failures_by_cause"] == {"inference_http_500": 1}
    (group,) = read_groups(redis_client)
    first = PromptQueue(load_prompts(settings.dataset), seed=0).next()
    assert group.prompt_id == first.prompt_id  # the failed prompt was retried first, and won
    assert not producer.prompts.attempts  # its failure was forgotten when the retry won


async def test_llm_503_is_retried_then_the_group_fails_as_an_outage(fake_llm, make_settings, redis_client):
    settings = make_settings(fake_llm.url, agent="search-r1", n_samples=1, max_running_groups=1, retry_attempts=2)
    fake_llm.fail_next(2, status=503)  # both tries of the first call
    producer = await run_producer(settings, redis_client, max_groups=2)
    assert fake_llm.requests == 2 + len(fake_llm.calls)  # the failing call was tried exactly twice
    assert producer.failures == {"inference_http_503": 1} and producer.stats.published == 1
    assert producer.status()["blamed_failures_by_cause"] == {}  # the server's outage, not the prompt's fault
    (group,) = read_groups(redis_client)
    assert group.prompt_id == PromptQueue(load_prompts(settings.dataset), seed=0).next().prompt_id


async def test_transient_5xx_is_absorbed_by_retries(fake_llm, make_settings, redis_client):
    settings = make_settings(fake_llm.url, agent="search-r1", n_samples=1, max_running_groups=1, retry_attempts=3)
    fake_llm.fail_next(1, status=502)
    fake_llm.fail_next(1, status=429)
    producer = await run_producer(settings, redis_client, max_groups=1)
    assert producer.stats.failed == 0 and producer.stats.published == 1


def retriever_503() -> FastAPI:
    app = FastAPI()

    @app.post("/retrieve")
    def retrieve() -> JSONResponse:
        return JSONResponse({"error": {"message": "index reloading"}}, status_code=503)

    return app


async def test_llm_down_fails_groups_and_the_loop_survives(make_settings, redis_client):
    settings = make_settings(f"http://127.0.0.1:{free_port()}", agent="search-r1", n_samples=2)
    producer = await run_producer(settings, redis_client, max_groups=2)
    assert producer.failures == {"inference_unreachable": 2} and producer.stats.published == 0
    assert len(producer.prompts.retry) == 2


async def test_llm_4xx_is_not_retried(fake_llm, make_settings, redis_client):
    settings = make_settings(
        fake_llm.url, agent="search-r1", n_samples=1, max_running_groups=1, model_name="policy-v9"
    )  # an adapter the server does not have: 404
    producer = await run_producer(settings, redis_client, max_groups=1)
    assert producer.failures == {"inference_http_404": 1} and fake_llm.requests == 1


@pytest.mark.parametrize("mode", ["down", "503"])
async def test_retriever_failures_fail_groups_and_the_loop_survives(mode, fake_llm, make_settings, redis_client):
    if mode == "down":
        producer = await run_producer(
            make_settings(fake_llm.url, retriever_url=f"http://127.0.0.1:{free_port()}", agent="coda", n_samples=2),
            redis_client,
            max_groups=3,
        )
        assert producer.failures == {"retriever_unreachable": 3}
    else:
        with ThreadedServer(retriever_503()) as url:
            producer = await run_producer(
                make_settings(fake_llm.url, retriever_url=url, agent="search-r1"), redis_client, max_groups=3
            )
        assert producer.failures == {"retriever_http_503": 3}
    assert producer.stats.published == 0 and redis_client.xlen("trajectories") == 0
    assert len(producer.prompts.retry) == 3  # every failed prompt is back in the queue


class RedisDown(StreamQueue):
    def publish(self, message):
        raise redis.ConnectionError("Redis is restarting")


async def test_publish_failure_requeues_and_keeps_running(fake_llm, make_settings, redis_client):
    settings = make_settings(fake_llm.url, agent="search-r1", n_samples=1, max_running_groups=1)
    producer = await run_producer(
        settings, redis_client, max_groups=2, publisher=RedisDown(redis_client, "trajectories", TrajectoryGroup)
    )
    assert producer.failures == {"redis_error": 2} and len(producer.prompts.retry) == 1
    assert producer.prompts.attempts.total() == 0  # Redis failing is an outage: the prompt is not counted
