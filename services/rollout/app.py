"""The rollout service's FastAPI app: the producer and the weight sync run as background tasks of a plain
``Runtime`` object (its metrics its own) the app starts and stops in its lifespan, as the trainer's app runs
beside its ``Trainer``.

Routes: ``/health`` (Redis reachable, producer alive), ``/metrics``, ``GET /status`` (version, admission,
counts, failures by cause, the fleet of policy servers). Episodes go to the fleet (``services.rollout.fleet``):
the listed servers and those announced in Redis, kept fresh and on the live weights by ``WeightSync``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

import redis
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from services.rollout.admission import Admission, RedisAdmission
from services.rollout.config import RolloutSettings
from services.rollout.embedding import make_embedder
from services.rollout.fleet import FleetRunner
from services.rollout.metrics import FleetCollector, RolloutMetrics
from services.rollout.producer import Producer, PromptQueue
from services.rollout.runtime import agent_context
from services.rollout.weight_sync import WeightSync
from shared.contract import announce
from shared.http import create_app
from shared.log import get_logger
from shared.protocol import TrajectoryGroup
from shared.stream import StreamQueue

log = get_logger(__name__)


class Runtime:
    """What one ``serve`` process runs: the admission gate, the weight sync (follower + fleet watch) and the
    producer, as background tasks. ``start`` builds and starts them (a rollout whose pipeline contract differs
    from the trainer's refuses to start); ``stop`` cancels and closes them. Its metrics go to ``registry`` (a
    new one by default: the app serves it at ``/metrics``)."""

    def __init__(self, settings: RolloutSettings, *, registry: CollectorRegistry | None = None, tok=None) -> None:
        self.s, self.tok = settings, tok
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = RolloutMetrics(self.registry)
        self.tasks: list[asyncio.Task] = []
        self.producer: Producer | None = None
        self.redis: redis.Redis | None = None
        self._stack = contextlib.AsyncExitStack()

    async def start(self) -> None:
        s = self.s
        self.redis = redis.Redis.from_url(s.redis_url)
        self._stack.callback(self.redis.close)
        try:
            await self._start()
        except BaseException:
            await self._stack.aclose()
            raise

    async def _start(self) -> None:
        s, client = self.s, self.redis
        # First of all: a rollout whose pipeline contract differs from the trainer's must not start.
        await asyncio.to_thread(announce, client, s.contract(), "rollout")
        records = s.records()
        # Built first: a choice_weight that leaves no prompts is refused before anything else starts.
        prompts = PromptQueue(records, seed=s.seed, epochs=s.epochs, choice_weight=s.choice_weight)
        ctx = await self._stack.enter_async_context(agent_context(s, tok=self.tok))
        accepted = int(await asyncio.to_thread(client.get, s.published_key) or 0)
        self.admission = admission = self._admission(accepted)
        sync = WeightSync(s, ctx.policy.state, client, on_version=self._on_version, on_consumed=admission.set_consumed)
        self._stack.push_async_callback(sync.aclose)
        fleet_metrics = FleetCollector(sync.fleet.status)
        self.metrics.registry.register(fleet_metrics)
        self._stack.callback(self.metrics.registry.unregister, fleet_metrics)
        await sync.start()
        if admission.capacity < 0:
            log.warning(
                "more groups were published than the trainer has taken; the rollout waits for "
                "the trainer to catch up (for a fresh run, delete the counter key)",
                extra={
                    "key": s.published_key,
                    "accepted": accepted,
                    "version": ctx.policy.state.version,
                    "capacity": admission.capacity,
                },
            )
        runner = FleetRunner(s, ctx, sync.fleet, answers=sync.watch.answers)
        self._stack.push_async_callback(runner.aclose)
        self.producer = Producer(
            s,
            ctx,
            publisher=StreamQueue(client, s.stream, TrajectoryGroup, maxlen=s.stream_maxlen),
            client=client,
            admission=admission,
            metrics=self.metrics,
            embed=make_embedder(s.embedder),
            prompts=prompts,
            fleet=runner,
        )
        # The order /health lists them in: the weights, the producer, the fleet.
        weights, fleet = sync.tasks()
        self.tasks = [weights, asyncio.create_task(self.producer.run(), name="producer"), fleet]
        log.info(
            "rollout started",
            extra={
                "agent": s.agent,
                "prompts": len(records),
                "choice_prompts": len(prompts.choices),
                "choice_weight": s.choice_weight,
                "drop_flat_groups": s.drop_flat_groups,
                "version": ctx.policy.state.version,
                "accepted": accepted,
            },
        )

    def _admission(self, accepted: int) -> Admission:
        s = self.s
        if s.admission_scope == "redis":
            admission = RedisAdmission(
                self.redis,
                f"{socket.gethostname()}-{os.getpid()}",
                s.max_staleness,
                s.groups_per_step,
                max_running=s.max_running_groups,
                published_key=s.published_key,
            )
            admission.accepted = accepted
            return admission
        return Admission(s.max_staleness, s.groups_per_step, accepted=accepted, max_running=s.max_running_groups)

    async def _on_version(self, version: int) -> None:
        self.metrics.version.labels("rollout").set(version)
        await self.admission.set_version(version)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self._stack.aclose()

    def task_state(self, name: str) -> str:
        """``/health``'s word on the task ``name``: running, finished, or an error naming why it stopped."""
        task = next(t for t in self.tasks if t.get_name() == name)
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise RuntimeError(f"{name} stopped: {task.exception()!r}")
        return "finished" if task.done() else "running"


def build_app(settings: RolloutSettings, *, tok=None) -> FastAPI:
    """The rollout's app around one ``Runtime`` (``app.state.runtime``), started and stopped with the app."""
    runtime = Runtime(settings, tok=tok)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    app, _ = create_app(
        "rollout",
        lifespan=lifespan,
        description="Agent episodes → trajectory groups",
        registry=runtime.registry,
        health_checks={
            "redis": lambda: runtime.redis.ping() and "ok",
            "producer": lambda: runtime.task_state("producer"),
            "weights": lambda: runtime.task_state("weights"),
            "fleet": lambda: runtime.task_state("fleet"),
        },
    )
    app.state.runtime = runtime

    @app.get("/status", tags=["rollout"], summary="Version, admission state, counts and failures")
    def status() -> dict:
        return runtime.producer.status()

    return app
