"""Keeps the fleet's view of its servers fresh and brings servers behind up to date: the one owner of what
every policy server serves (weights flow one way, docs/architecture.md, "The pipeline").

Every ``fleet_probe_s`` seconds, and at once after a weight update (``wake``), the watch

1. reads who announced themselves in Redis (``shared.server_registry``) and makes them the fleet's members
   beside the servers the settings list;
2. probes each member: ``GET /v1/models`` (open on vLLM and ours) says it is up, and which weight version
   it serves: under LoRA, the newest version whose adapter name (``<served>-<run>-vN``,
   ``shared.protocol.adapter_name``, from the ``weights`` stream) it lists, the base model counting as 0; under full reloads, ``coda_weight_info`` through
   ``/collective_rpc`` (what the trainer's sync check asks too; a server that never loaded weights serves
   version 0).
   Where that route is refused (a 4xx: a vLLM without our worker extension, or no control token for a
   remote server) the version cannot be known and the server is taken to serve the live one: the completions
   of our server still report the version that sampled them (``PolicyGenerator``);
3. tells each server that is up but behind to load the live version from the path the trainer announced
   (``services.rollout.loader``; the rollout orchestrates its servers, prime-rl's shape): a LoRA adapter under
   its ``<served>-<run>-vN`` name, or a full reload, with the control token (``shared.auth``). The trainer only
   writes and announces, so every server, the one beside the trainer included, is behind for the moment
   between an announcement and the load the watch makes at once (the announcement wakes it); a server that
   joins or restarts later catches up the same way, and the trainer never knows the fleet. Under LoRA,
   adapters of another run (a server that outlived a Redis wipe holds the old run's ``vN``, or names of the
   release before, without a run) are unloaded first, never counted as versions and never served; so are
   adapters that will be older than the ``keep_adapters`` newest (``max_loras`` bounds a server); the
   trainer deletes their folders. Several rollout replicas each run a
   watch: two may load one version into one server at once (a full reload twice, or a LoRA load refused as
   already loaded and logged); the next probe sees the server serve it either way.

How the rollout knows the live version: the weight follower (``services.rollout.weights``) moves the
``PolicyState`` on each ``WeightUpdate``; the fleet reads that state at every pick, so servers not yet probed
at the new version get no episode until the probe this update triggers says they serve it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import httpx
import redis

from agents.core.llm import PolicyState
from services.rollout.config import RolloutSettings
from services.rollout.fleet import Fleet, Server
from services.rollout.loader import LOAD_TIMEOUT_S, load_update, unload_adapter
from shared.inference_client import InferenceClient, InferenceError
from shared.log import get_logger
from shared.protocol import WeightUpdate, parse_adapter_name
from shared.retry import RetryPolicy
from shared.server_registry import announced

log = get_logger(__name__)

PROBE_TIMEOUT_S = 5.0  # a server that takes longer to list its models is not one to send episodes to
SYNC_RETRY_S = 10.0  # between two loads into one server that failed


class FleetWatch:
    def __init__(
        self,
        fleet: Fleet,
        state: PolicyState,
        *,
        redis_client: redis.Redis | None,
        servers_key: str,
        every_s: float,
        live_event: Callable[[], WeightUpdate | None] = lambda: None,
        keep_adapters: int = 3,
    ) -> None:
        self.fleet, self.state, self.r, self.key, self.every_s = fleet, state, redis_client, servers_key, every_s
        self.live_event, self.keep_adapters = live_event, keep_adapters
        self.clients: dict[str, InferenceClient] = {}  # probes and loads: one try each, the watch comes again
        self.loads = 0  # versions this watch loaded into servers
        self._wake = asyncio.Event()
        self._syncing: dict[str, asyncio.Task] = {}
        self._sync_failed: dict[str, float] = {}  # url → when a load into it last failed (retried after a pause)

    @classmethod
    def for_settings(
        cls,
        settings: RolloutSettings,
        state: PolicyState,
        redis_client: redis.Redis | None,
        live_event: Callable[[], WeightUpdate | None] = lambda: None,
    ) -> FleetWatch:
        """The fleet of ``settings``' listed servers, following ``state``'s version, and its watch."""
        fleet = Fleet([settings.inference_url, *settings.inference_urls], state.live_version)
        return cls(
            fleet,
            state,
            redis_client=redis_client,
            servers_key=settings.servers_key,
            every_s=settings.fleet_probe_s,
            live_event=live_event,
            keep_adapters=settings.keep_adapters,
        )

    def wake(self) -> None:
        """Probe now (a weight update: the servers' versions must be checked against the new one)."""
        self._wake.set()

    async def run(self) -> None:
        """Refresh every ``every_s`` or on ``wake``, until cancelled."""
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.every_s)
                self._wake.clear()  # before the refresh: a wake during it asks for another
                await self.refresh()
        finally:
            for task in self._syncing.values():
                task.cancel()

    async def refresh(self) -> None:
        """Members from Redis, then every member probed (concurrently)."""
        if self.r is not None and self.key:
            try:
                self.fleet.set_announced(await asyncio.to_thread(announced, self.r, self.key))
            except redis.RedisError as exc:  # keep the members we know; the stream's users report the outage
                log.warning("server announcements unreadable", extra={"error": repr(exc)[:200]})
        await asyncio.gather(*(self._probe(url) for url in list(self.fleet.servers)))

    async def answers(self) -> bool:
        """The outage gate's probe of ``inference``: after a refresh, may any server take an episode?"""
        await self.refresh()
        return bool(self.fleet.eligible())

    def _client(self, url: str) -> InferenceClient:
        if url not in self.clients:
            timeout = httpx.Timeout(LOAD_TIMEOUT_S, connect=PROBE_TIMEOUT_S)
            self.clients[url] = InferenceClient(url, timeout=timeout, retry=RetryPolicy(attempts=1))
        return self.clients[url]

    async def _probe(self, url: str) -> None:
        server = self.fleet.servers.get(url)
        was_up, client = server is not None and server.up, self._client(url)
        try:
            ids, version = await asyncio.wait_for(self._served(client), PROBE_TIMEOUT_S)
        # ValueError: an answer that is not the model list (another service on that port) is no server either.
        except (InferenceError, httpx.HTTPError, TimeoutError, ValueError) as exc:
            if busy_not_down(server, exc):
                # A server with episodes running that is slow to list its models is busy, not gone: marking it
                # down would starve its own queue (nothing else to pick at N = 1) until a probe gets through.
                # If it is gone, its episodes' requests fail and mark it down (``Fleet.failed``).
                log.debug("probe timed out on a busy policy server", extra={"server": url})
                return
            if was_up:
                log.warning("policy server stopped answering", extra={"server": url, "error": repr(exc)[:200]})
            self.fleet.observe(url, up=False)
            return
        if not was_up:
            log.info("policy server answers", extra={"server": url, "version": version, "live": self.state.version})
        self.fleet.observe(url, up=True, version=version)
        if version < self.state.version:
            self._start_sync(url, ids)

    async def _served(self, client: InferenceClient) -> tuple[set[str], int]:
        """The model ids ``client``'s server lists and the weight version it serves (module docstring)."""
        ids = {card.id for card in await client.models()}
        state = self.state
        if state.model_name != state.served_model_name:  # LoRA: its adapters say which versions it has
            return ids, max((v for v, name in state.history if name in ids), default=0)
        if state.version == 0:
            return ids, 0
        try:
            served = await client.served_version()
        except InferenceError as exc:
            if exc.status_code >= 500:
                raise
            return ids, state.version  # cannot be known: taken as live (module docstring)
        return ids, served or 0

    def _start_sync(self, url: str, ids: set[str]) -> None:
        event = self.live_event()
        if event is None or event.version != self.state.version:  # the path of the live version is unknown
            return
        if url in self._syncing or time.monotonic() - self._sync_failed.get(url, -SYNC_RETRY_S) < SYNC_RETRY_S:
            return  # a load running, or one that just failed: versions published in quick succession still sync
        task = asyncio.create_task(self._sync(url, event, ids), name=f"sync {url}")
        self._syncing[url] = task
        self.fleet.set_loading(url, True)
        task.add_done_callback(lambda _: self._sync_ended(url))

    def _sync_ended(self, url: str) -> None:
        self._syncing.pop(url, None)
        self.fleet.set_loading(url, False)

    async def _sync(self, url: str, event: WeightUpdate, ids: set[str]) -> None:
        """Load ``event``'s weights into the server at ``url``; a failure is logged and tried again later."""
        client = self._client(url)
        log.info("policy server behind: loading the live weights", extra={"server": url, "version": event.version})
        try:
            # First: the slots the new adapter needs. A rollout killed between a load and the unloads after it
            # left its server at max_loras, which then refused every later load (the soak's rollout kill).
            if event.kind == "lora":
                await self._unload(client, self.stale(ids, event))
            await load_update(client, event)
        except (InferenceError, httpx.HTTPError, ValueError) as exc:
            log.warning(
                "could not load the live weights into a policy server; trying again later",
                extra={"server": url, "version": event.version, "error": repr(exc)[:300]},
            )
            self._sync_failed[url] = time.monotonic()
            return
        self._sync_failed.pop(url, None)
        self.loads += 1
        self.wake()  # probe it now: it takes episodes again from the next pick

    def stale(self, ids: set[str], event: WeightUpdate) -> list[str]:
        """The adapters among ``ids`` to unload before ``event``'s is loaded: those of the served model from
        another run than ``event``'s (or of no run: the release before), and this run's that will not be among
        the ``keep_adapters`` newest once it is (``max_loras`` is small)."""
        live = parse_adapter_name(event.model_name)
        if live is None:
            return []
        out = []
        for name in ids - {self.state.served_model_name, event.model_name}:
            held = parse_adapter_name(name)
            if held is None or held.served != live.served:
                continue  # not an adapter of this policy (another model the server serves)
            if held.run != live.run or held.version <= live.version - self.keep_adapters:
                out.append(name)
        return sorted(out)

    async def _unload(self, client: InferenceClient, names: list[str]) -> None:
        for name in names:
            await unload_adapter(client, name)

    async def aclose(self) -> None:
        for task in list(self._syncing.values()):  # loads still running (a watch closed without ``run``)
            task.cancel()
        await asyncio.gather(*self._syncing.values(), return_exceptions=True)
        for client in self.clients.values():
            await client.aclose()


def busy_not_down(server: Server | None, exc: BaseException) -> bool:
    """A probe that timed out on a server that is up with episodes outstanding: it keeps its state.

    Only a timeout (a refused connection or an error answer still means down), and only while episodes run
    there: an idle server that cannot answer in ``PROBE_TIMEOUT_S`` is not one to send episodes to.
    """
    timed_out = isinstance(exc, TimeoutError | httpx.TimeoutException)
    return timed_out and server is not None and server.up and server.outstanding > 0
