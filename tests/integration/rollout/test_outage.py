"""A dependency outage pauses the producer instead of burning prompts: the real retriever behind a switch
(closed port or 503) while the producer runs against the scripted LLM and a real Redis."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from agents.datasets import load_prompts
from agents.prompts import CharTokenizer
from services.rollout.admission import Admission
from services.rollout.embedding import hashing_embed
from services.rollout.metrics import RolloutMetrics
from services.rollout.producer import Producer, PromptQueue
from services.rollout.runtime import agent_context
from shared.protocol import TrajectoryGroup
from shared.redis_server import free_port
from shared.stream import StreamQueue
from testing.serving import ThreadedServer

TOK = CharTokenizer()


class SwitchedRetriever:
    """The real retriever behind a proxy on a fixed 127.0.0.1 port that can be switched ``up``, ``503``
    (every route, /health included), ``400`` (a request the retriever rejects) or ``closed`` (nothing listens)."""

    def __init__(self, target: str) -> None:
        self.target, self.mode, self.port = target.rstrip("/"), "up", free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: ThreadedServer | None = None

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.api_route("/{path:path}", methods=["GET", "POST"])
        async def forward(path: str, request: Request) -> Response:
            if self.mode in ("503", "400"):
                return JSONResponse({"error": {"message": f"switched to {self.mode}"}}, int(self.mode))
            async with httpx.AsyncClient(timeout=30) as client:
                answer = await client.request(
                    request.method,
                    f"{self.target}/{path}",
                    content=await request.body(),
                    headers={"content-type": "application/json"},
                )
            return Response(answer.content, answer.status_code, media_type=answer.headers.get("content-type"))

        return app

    def switch(self, mode: str) -> None:
        """Blocking (stops or starts a server thread): call it through ``asyncio.to_thread`` from a test."""
        if mode == "closed" and self.server is not None:
            self.server.stop()
            self.server = None
        elif mode != "closed" and self.server is None:
            self.server = ThreadedServer(self.app(), port=self.port)  # same port: the rollout's URL stays valid
            self.server.start()
        self.mode = mode


@pytest.fixture
def switched(retriever_url):
    retriever = SwitchedRetriever(retriever_url)
    retriever.switch("up")
    yield retriever
    retriever.switch("closed")


async def until(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.05)


def producer_for(settings, ctx, redis_client) -> Producer:
    return Producer(
        settings,
        ctx,
        client=redis_client,
        embed=hashing_embed,
        metrics=RolloutMetrics(),
        publisher=StreamQueue(redis_client, "trajectories", TrajectoryGroup),
        admission=Admission(1000, 1, max_running=settings.max_running_groups),
        prompts=PromptQueue(load_prompts(settings.dataset), seed=0),
    )


def waiting(producer: Producer, dependency: str) -> float | None:
    return producer.metrics.registry.get_sample_value("coda_rollout_waiting_for_dependency", {"dependency": dependency})


@pytest.mark.parametrize("outage", ["closed", "503"])
async def test_retriever_outage_pauses_admission_and_drops_no_prompt(
    outage, switched, fake_llm, make_settings, redis_client
):
    # max_prompt_failures=1: before the fix every group the outage failed dropped its prompt for good.
    settings = make_settings(
        fake_llm.url,
        retriever_url=switched.url,
        agent="search-r1",
        n_samples=2,
        max_running_groups=2,
        max_prompt_failures=1,
        retry_attempts=2,
    )
    async with agent_context(settings, tok=TOK) as ctx:
        producer = producer_for(settings, ctx, redis_client)
        task = asyncio.create_task(producer.run())
        try:
            await until(lambda: producer.stats.published >= 3)
            await asyncio.to_thread(switched.switch, outage)
            await asyncio.sleep(4.0)  # the outage lasts; each group would fail within ~0.1 s if admitted
            during = producer.status()
            during_metric = waiting(producer, "retriever")
            await asyncio.to_thread(switched.switch, "up")
            published = producer.stats.published
            await until(lambda: producer.stats.published >= published + 3)  # production resumes
            after = producer.status()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert after["dropped"] == 0 and not producer.prompts.attempts  # the outage counted against no prompt
    assert during["waiting_for"] == "retriever" and during["outage_cause"].startswith("retriever_")
    assert during_metric == 1.0 and waiting(producer, "retriever") == 0.0
    assert after["waiting_for"] is None and after["failures_by_cause"]
    assert all(cause.startswith("retriever_") for cause in after["failures_by_cause"])
    # paused, not spinning: only the groups in flight when it went down (plus a race or two) failed
    assert 1 <= after["failed"] <= 2 * settings.max_running_groups
    assert (
        producer.metrics.registry.get_sample_value("coda_rollout_dependency_outages_total", {"dependency": "retriever"})
        == 1.0
    )


async def test_the_prompts_own_failures_still_count_and_drop(switched, fake_llm, make_settings, redis_client):
    # A 400 from the retriever is the request's fault, not an outage: no pause, and prompts are dropped.
    switched.mode = "400"
    settings = make_settings(
        fake_llm.url,
        retriever_url=switched.url,
        agent="search-r1",
        n_samples=1,
        max_running_groups=1,
        max_prompt_failures=2,
    )
    async with agent_context(settings, tok=TOK) as ctx:
        producer = producer_for(settings, ctx, redis_client)
        await asyncio.wait_for(producer.run(max_groups=4), 60)
    assert producer.failures == {"retriever_http_400": 4}
    assert producer.stats.dropped == 2 and not producer.prompts.retry  # two prompts, two tries each
    assert producer.status()["waiting_for"] is None and waiting(producer, "retriever") is None


async def test_a_prompts_failure_count_resets_when_it_succeeds(fake_llm, make_settings, redis_client):
    fake_llm.fail_next(1, status=400)  # never retried; the prompt's own failure
    settings = make_settings(fake_llm.url, agent="search-r1", n_samples=1, max_running_groups=1)
    async with agent_context(settings, tok=TOK) as ctx:
        producer = producer_for(settings, ctx, redis_client)
        await asyncio.wait_for(producer.run(max_groups=2), 60)
    assert producer.failures == {"inference_http_400": 1} and producer.stats.published == 1
    assert not producer.prompts.attempts  # counted once, then forgotten when the retry won
    assert producer.status()["waiting_for"] is None
