"""A fleet of policy servers under the producer: two scripted fake LLMs over real HTTP on 127.0.0.1, a real
Redis. Both servers get episodes and each episode stays on one; a server killed mid-run costs no group (its
episodes start over on the other) and no episode is scored twice or in part; a server behind the live version
gets no episode until it caught up (loaded by the rollout itself from the live event, or by hand while the
live weights' path is unknown); servers
join by announcing themselves in Redis, as the inference server does."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from agents.datasets import load_prompts
from agents.prompts import CharTokenizer
from services.inference.app import start_heartbeat
from services.inference.config import InferenceSettings
from services.rollout.admission import Admission
from services.rollout.config import RolloutSettings
from services.rollout.embedding import hashing_embed
from services.rollout.fleet import FleetRunner
from services.rollout.fleet_watch import FleetWatch
from services.rollout.metrics import RolloutMetrics
from services.rollout.producer import Producer, PromptQueue
from services.rollout.runtime import agent_context
from shared.protocol import TrajectoryGroup, WeightUpdate
from shared.server_registry import announced, register
from shared.stream import StreamQueue
from testing.fake_llm import FakeLLM, protocol_script
from testing.serving import ThreadedServer

TOK = CharTokenizer()
KEY = "test:servers:"


@contextlib.contextmanager
def fake_server(delay_s: float = 0.02):
    fake = FakeLLM(TOK, protocol_script, delay_s=delay_s)
    server = ThreadedServer(fake.app())
    fake.url = server.start()
    fake.server = server
    try:
        yield fake
    finally:
        server.stop()  # a second stop (the test killed it) is a no-op


def settings_for(redis_url: str, urls: list[str], **overrides) -> RolloutSettings:
    # The recursive reasoner needs no retriever and sends 4 requests per episode (decompose, two workers on
    # the frozen generator, combine), each naming the problem: where its calls went shows where it ran.
    base = dict(
        tokenizer="char",
        agent="recursive-reasoner",
        dataset="synthetic:arithmetic:32",
        inference_url=urls[0],
        inference_urls=urls[1:],
        redis_url=redis_url,
        servers_key=KEY,
        fleet_probe_s=0.2,
        server_wait_s=5,
        n_samples=1,
        max_running_groups=4,
        retry_attempts=2,
        retry_backoff_s=0.01,
        http_timeout_s=10,
    )
    return RolloutSettings.load(**{**base, **overrides})


@contextlib.asynccontextmanager
async def fleet_producer(settings: RolloutSettings, redis_client, *, live_event=lambda: None):
    """The producer as the app wires it, with the fleet's watch running."""
    async with agent_context(settings, tok=TOK) as ctx:
        watch = FleetWatch.for_settings(settings, ctx.policy.state, redis_client, live_event)
        fleet = watch.fleet
        await watch.refresh()
        runner = FleetRunner(settings, ctx, fleet, answers=watch.answers)
        producer = Producer(
            settings,
            ctx,
            client=redis_client,
            embed=hashing_embed,
            metrics=RolloutMetrics(),
            publisher=StreamQueue(redis_client, "trajectories", TrajectoryGroup),
            admission=Admission(1000, 1, max_running=settings.max_running_groups),
            prompts=PromptQueue(load_prompts(settings.dataset), seed=0),
            fleet=runner,
        )
        task = asyncio.create_task(watch.run())
        try:
            yield producer, fleet, watch
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await runner.aclose()
            await watch.aclose()


def problems(fake: FakeLLM) -> set[str]:
    return {c.prompt_text.split("Problem: ")[-1].split("\n")[0] for c in fake.calls if "Problem: " in c.prompt_text}


def unfinished(fake: FakeLLM) -> set[str]:
    """Problems whose episode ``fake`` has served a turn of but not the last one (the combining turn)."""
    combined = [c.prompt_text for c in fake.calls if c.prompt_text.startswith("Put these partial")]
    last = {text.split("Whole problem: ")[-1].split("\n")[0] for text in combined}
    return problems(fake) - last


def published(redis_client) -> list[TrajectoryGroup]:
    queue = StreamQueue(redis_client, "trajectories", TrajectoryGroup, group="check", consumer="t")
    queue.ensure_group()
    return [e.message for e in queue.read(count=1000)]


async def test_two_servers_share_the_episodes_and_each_episode_stays_on_one(redis_server, redis_client):
    with fake_server() as a, fake_server() as b:
        # a is listed in the settings; b only announces itself, like an inference server given a Redis URL
        register(redis_client, KEY, b.url, ttl_s=30)
        settings = settings_for(redis_server.url, [a.url])
        async with fleet_producer(settings, redis_client) as (producer, fleet, _):
            assert sorted(fleet.servers) == sorted([a.url, b.url])
            stats = await asyncio.wait_for(producer.run(max_groups=12), 60)
    assert stats.published == 12 and stats.failed == 0
    assert a.calls and b.calls  # both served
    assert not problems(a) & problems(b)  # no episode's turns were split between servers
    assert len(problems(a) | problems(b)) == 12
    assert producer.status()["fleet"]["servers"][b.url]["episodes"] >= 3


async def test_a_server_killed_mid_run_costs_no_group_and_no_episode_counts_twice(redis_server, redis_client):
    # b is slow (0.5 s a request, 2 s an episode), so an episode it has begun is still running when it stops:
    # at 0.05 s a request a loaded machine finished all of b's episodes before its listener closed (CI,
    # 2026-11-27), and nothing was restarted.
    with fake_server(delay_s=0.05) as a, fake_server(delay_s=0.5) as b:
        settings = settings_for(redis_server.url, [a.url, b.url], n_samples=2)
        async with fleet_producer(settings, redis_client) as (producer, _fleet, _):
            run = asyncio.create_task(producer.run(max_groups=8))
            deadline = time.monotonic() + 30
            while not unfinished(b):  # b is in the middle of an episode
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            # Its own thread: the event loop's default executor may be busy (a stop queued behind it came late).
            stopper = threading.Thread(target=b.server.stop)
            stopper.start()
            await asyncio.to_thread(stopper.join)
            stats = await asyncio.wait_for(run, 60)
            status = producer.status()
    groups = published(redis_client)
    assert stats.published == len(groups) == 8 and stats.failed == 0
    assert status["fleet"]["restarted_episodes"] >= 1 and status["fleet"]["servers"][b.url]["failures"] >= 1
    # Scored: exactly the 16 episodes of the 8 groups, though more were started (the restarted tries)
    assert stats.episodes == 16
    assert sum(s["episodes"] for s in status["fleet"]["servers"].values()) > 16
    assert len({g.prompt_id for g in groups}) == 8 and len({g.group_id for g in groups}) == 8
    combined = [c.prompt_text for c in a.calls + b.calls if c.prompt_text.startswith("Put these partial")]
    for group in groups:  # whole episodes only: two samples, and two episodes that reached the last turn
        assert len(group.samples) == 2
        assert sum(f"Whole problem: {group.question.strip()}\n" in text for text in combined) >= 2


async def lagging_run(redis_server, redis_client, *, path_known: bool) -> None:
    """``path_known``: the watch has the live event (where the weights are) and loads them into b itself;
    else (no event read yet) it cannot, and b stays behind until it is loaded by hand."""
    with fake_server() as a, fake_server() as b:
        a.loras["policy-v1"] = "/w/1"  # the rollout loaded version 1 into a; b restarted without it
        event = WeightUpdate(version=1, kind="lora", model_name="policy-v1", path="/w/1", step=1, created_at=0.0)
        settings = settings_for(redis_server.url, [a.url, b.url])
        live = (lambda: event) if path_known else (lambda: None)
        async with fleet_producer(settings, redis_client, live_event=live) as (producer, fleet, _):
            producer.ctx.policy.state.advance(1, "policy-v1")  # what the weight follower does on the event
            if not path_known:
                stats = await asyncio.wait_for(producer.run(max_groups=6), 60)
                assert stats.failed == 0 and len(a.calls) == 24 and b.requests == 0  # 6 episodes × 4 requests
                b.loras["policy-v1"] = "/w/1"  # someone loads version 1 into b
            deadline = time.monotonic() + 10
            while fleet.servers[b.url].version != 1:  # the next probe sees it (or the watch loaded it)
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            stats = await asyncio.wait_for(producer.run(max_groups=8), 60)
    assert stats.failed == 0
    # The policy turns ask for the live adapter (a server without it answers 404); the worker turns are the
    # frozen base model's.
    assert {c.model for c in a.calls + b.calls} == {"policy-v1", "policy"}
    assert any(c.model == "policy-v1" for c in b.calls)
    assert all(
        v == 1
        for g in published(redis_client)
        for s in g.samples
        for v, m in zip(s.versions, s.loss_mask, strict=True)
        if m
    )


async def test_a_lagging_server_gets_no_episodes_until_it_caught_up(redis_server, redis_client):
    await lagging_run(redis_server, redis_client, path_known=False)


async def test_the_rollout_loads_the_live_adapter_into_a_server_behind(redis_server, redis_client):
    await lagging_run(redis_server, redis_client, path_known=True)


def test_the_inference_server_announces_itself_only_when_told(redis_server, redis_client):
    assert start_heartbeat(InferenceSettings(redis_url=redis_server.url)) is None  # default: no announcement
    settings = InferenceSettings(
        redis_url=redis_server.url, advertise_url="http://{hostname}:8002/", servers_key=KEY, announce_every_s=0.1
    )
    heartbeat = start_heartbeat(settings)
    try:
        deadline = time.monotonic() + 5
        while not announced(redis_client, KEY):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        (url,) = announced(redis_client, KEY)
        assert url.startswith("http://") and url.endswith(":8002") and "{hostname}" not in url
        assert 0 < redis_client.pttl(KEY + url) <= 300  # expires by itself after three missed beats
    finally:
        heartbeat.stop()
    assert announced(redis_client, KEY) == []  # withdrawn on a clean stop
