"""The rollout's weight sync: follow the trainer's announcements and keep every policy server on them.

Two parts, started and stopped together: the ``WeightFollower`` (``services.rollout.weights``) reads the
``weights`` stream and moves the live ``PolicyState``; each new version wakes the ``FleetWatch``
(``services.rollout.fleet_watch``), which loads it into every server behind (``services.rollout.loader``).
The follower's newest event is where the watch finds the live weights.

``serve`` runs it beside the producer; ``python -m services.rollout sync-weights`` runs it alone, for a
trainer that trains on no episodes (``[trainer] sft_only``) while its published weights are served; ``eval`` of the live policy uses it
once (``serve_live``) to load the last announced version into its server.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable, Callable

import redis

from agents.core.llm import PolicyState
from services.rollout.config import RolloutSettings
from services.rollout.fleet import normalize
from services.rollout.fleet_watch import FleetWatch
from services.rollout.weights import WeightFollower
from shared.log import get_logger

log = get_logger(__name__)


class WeightSync:
    """The follower and the fleet watch of one rollout process (asyncio)."""

    def __init__(
        self,
        settings: RolloutSettings,
        state: PolicyState,
        client: redis.Redis,
        *,
        on_version: Callable[[int], Awaitable[None]] | None = None,
        on_consumed: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        self.state, self.on_version = state, on_version
        self.watch = FleetWatch.for_settings(settings, state, client, lambda: self.follower.event)
        self.follower = WeightFollower(
            client,
            state,
            stream=settings.weights_stream,
            version_key=settings.version_key,
            admission_key=settings.admission_key,
            on_version=self._new_version,
            on_consumed=on_consumed,
        )

    @property
    def fleet(self):
        return self.watch.fleet

    async def _new_version(self, version: int) -> None:
        self.watch.wake()  # the servers' versions must be checked against the new one (and loaded)
        if self.on_version is not None:
            await self.on_version(version)

    async def start(self) -> None:
        """Catch up with the stream, then probe every server once (who is there before the first episode)."""
        await self.follower.start()
        await self.watch.refresh()
        if self.on_version is not None:
            await self.on_version(self.state.version)

    async def serve_live(self, url: str, timeout_s: float) -> bool:
        """Bring the server at ``url`` to the live version (loaded if it is behind) and wait until it serves
        it, at most ``timeout_s``: an eval of the live policy without a rollout running beside it."""
        deadline = time.monotonic() + timeout_s
        while True:
            await self.watch.refresh()  # probes, and starts a load into a server behind
            server = self.fleet.servers.get(normalize(url))
            if server is not None and server.eligible(self.state.version):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.2)

    def tasks(self) -> list[asyncio.Task]:
        """The follower's and the watch's loops, named as ``/health`` reports them."""
        return [
            asyncio.create_task(self.follower.run(), name="weights"),
            asyncio.create_task(self.watch.run(), name="fleet"),
        ]

    async def aclose(self) -> None:
        await self.watch.aclose()


async def run_alone(settings: RolloutSettings) -> None:
    """``sync-weights``: the weight sync without episodes, until SIGTERM or SIGINT."""
    client = redis.Redis.from_url(settings.redis_url)
    state = PolicyState(version=0, model_name=settings.served_model_name, served_model_name=settings.served_model_name)
    sync = WeightSync(settings, state, client)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await sync.start()
        tasks = sync.tasks()
        log.info("weight sync started", extra={"version": state.version, "servers": sorted(sync.fleet.servers)})
        await stop.wait()
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await sync.aclose()
        client.close()
