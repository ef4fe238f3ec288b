"""The rollout service's FastAPI app: the producer and the weight follower run as background tasks.

Routes: ``/health`` (Redis reachable, producer alive), ``/metrics``, ``GET /status`` (version, admission,
counts, failures by cause, the fleet of policy servers). Episodes go to the fleet (``services.rollout.fleet``):
the listed servers and those announced in Redis, kept fresh by ``FleetWatch``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

import redis
from fastapi import FastAPI

from services.rollout.admission import Admission, RedisAdmission
from services.rollout.config import RolloutSettings
from services.rollout.embedding import make_embedder
from services.rollout.fleet_runner import FleetRunner
from services.rollout.fleet_watch import FleetWatch
from services.rollout.metrics import FleetCollector, RolloutMetrics
from services.rollout.producer import Producer, PromptQueue
from services.rollout.runtime import agent_context
from services.rollout.weights import WeightFollower
from shared.contract import announce
from shared.http import create_app
from shared.log import get_logger
from shared.protocol import TrajectoryGroup
from shared.stream import StreamQueue

log = get_logger(__name__)


def build_app(settings: RolloutSettings, *, tok=None) -> FastAPI:
    metrics_holder: dict = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        client = redis.Redis.from_url(settings.redis_url)
        # First of all: a rollout whose pipeline contract differs from the trainer's must not start.
        try:
            await asyncio.to_thread(announce, client, settings.contract(), "rollout")
        except BaseException:
            client.close()
            raise
        records = settings.records()
        async with agent_context(settings, tok=tok) as ctx:
            accepted = int(await asyncio.to_thread(client.get, settings.published_key) or 0)
            if settings.admission_scope == "redis":
                admission = RedisAdmission(
                    client,
                    f"{socket.gethostname()}-{os.getpid()}",
                    settings.max_staleness,
                    settings.groups_per_step,
                    max_running=settings.max_running_groups,
                    published_key=settings.published_key,
                )
                admission.accepted = accepted
            else:
                admission = Admission(
                    settings.max_staleness,
                    settings.groups_per_step,
                    accepted=accepted,
                    max_running=settings.max_running_groups,
                )
            metrics = metrics_holder["metrics"]

            # The follower below is what knows where the live weights are (for servers behind them).
            watch = FleetWatch.for_settings(settings, ctx.policy.state, client, lambda: follower.event)
            fleet_metrics = FleetCollector(watch.fleet.status)
            metrics.registry.register(fleet_metrics)

            async def on_version(version: int) -> None:
                watch.wake()  # the servers' versions must be checked against the new one
                metrics.version.labels("rollout").set(version)
                await admission.set_version(version)

            follower = WeightFollower(
                client,
                ctx.policy.state,
                stream=settings.weights_stream,
                version_key=settings.version_key,
                admission_key=settings.admission_key,
                on_version=on_version,
                on_consumed=admission.set_consumed,
            )
            await follower.start()
            await watch.refresh()  # who is there before the first episode asks
            await on_version(ctx.policy.state.version)
            if admission.capacity < 0:
                log.warning(
                    "more groups were published than the trainer has taken; the rollout waits for "
                    "the trainer to catch up (for a fresh run, delete the counter key)",
                    extra={
                        "key": settings.published_key,
                        "accepted": accepted,
                        "version": ctx.policy.state.version,
                        "capacity": admission.capacity,
                    },
                )
            publisher = StreamQueue(client, settings.stream, TrajectoryGroup, maxlen=settings.stream_maxlen)
            runner = FleetRunner(settings, ctx, watch.fleet, answers=watch.answers)
            producer = Producer(
                settings,
                ctx,
                publisher=publisher,
                client=client,
                admission=admission,
                metrics=metrics,
                embed=make_embedder(settings.embedder),
                prompts=PromptQueue(records, seed=settings.seed, epochs=settings.epochs),
                fleet=runner,
            )
            app.state.producer, app.state.redis = producer, client
            tasks = [
                asyncio.create_task(follower.run(), name="weights"),
                asyncio.create_task(producer.run(), name="producer"),
                asyncio.create_task(watch.run(), name="fleet"),
            ]
            app.state.tasks = tasks
            log.info(
                "rollout started",
                extra={
                    "agent": settings.agent,
                    "prompts": len(records),
                    "version": ctx.policy.state.version,
                    "accepted": accepted,
                },
            )
            try:
                yield
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await runner.aclose()
                await watch.aclose()
                metrics.registry.unregister(fleet_metrics)
                client.close()

    def task_state(name: str) -> str:
        task = next(t for t in app.state.tasks if t.get_name() == name)
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise RuntimeError(f"{name} stopped: {task.exception()!r}")
        return "finished" if task.done() else "running"

    app, registry = create_app(
        "rollout",
        lifespan=lifespan,
        description="Agent episodes → trajectory groups",
        health_checks={
            "redis": lambda: app.state.redis.ping() and "ok",
            "producer": lambda: task_state("producer"),
            "weights": lambda: task_state("weights"),
            "fleet": lambda: task_state("fleet"),
        },
    )
    metrics_holder["metrics"] = RolloutMetrics(registry)

    @app.get("/status", tags=["rollout"], summary="Version, admission state, counts and failures")
    def status() -> dict:
        return app.state.producer.status()

    return app
