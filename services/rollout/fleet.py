"""The rollout's fleet of policy servers: which server gets the next episode (``Fleet``, no I/O), and running
each episode on one of them (``FleetRunner``).

The rollout samples from every server it knows: the recipe's (``inference_url`` and ``inference_urls``) and
those that announce themselves in Redis (``shared.server_registry``); ``services.rollout.fleet_watch`` keeps
this module's view of them fresh (who is up, which weight version each serves) and ``FleetRunner`` runs
episodes on the servers ``Fleet`` hands out.

The rules, all in ``pick``:

- An episode goes to a server that is up and serves the live policy version (``version >= live``). A server
  behind it (the rollout's fleet watch has not loaded the version just announced into it yet, or it joined or
  restarted since) gets no new episode until it caught up: its tokens would be stale, and under LoRA it
  would not even know the live adapter's name.
- Among those, the one with the fewest episodes outstanding (least outstanding requests: an episode is a
  series of requests to one server, so counting episodes counts the server's load); ties go to the server
  that was given fewer episodes so far, then to the lower URL, so the choice is deterministic.
- An episode stays on its server for all its turns (the server's prefix cache holds its earlier turns), so a
  lease is taken per episode, not per request.

The live version is read through a callable at each pick (the rollout's ``PolicyState``): the weight follower
moves it and the very next pick already refuses servers behind it, before any probe has run.

``FleetRunner`` runs each episode on one server of the fleet, and again from scratch on another when that
server fails. An episode leases a server (``Fleet.lease``) and keeps it for all its turns: its policy and frozen
generators are bound to that server's client, and its ``PolicyState`` is a copy of the live one taken when the
lease was granted, so every turn asks for the same model name (one weight version per episode; under LoRA the
older adapter stays loaded for the trainer's keep window, and the lease was granted only because the server
serves the live version).

A server that fails mid-episode (``shared.retry``: refused, dropped or timed out, 502/503/504/429 after the
client's own retries) is marked down and the episode starts over on another server, at most
``episode_attempts`` tries in all. What the failed try produced is dropped whole: an episode is returned only
when it finished, and a group is scored and published only when all its episodes finished, so nothing is
half-scored and nothing reaches the stream twice. When no other server can take it, the last failure is
raised as it was, and the producer counts the group failed in an inference outage (its prompt is re-queued
uncounted). Failures that are not the server's (a 4xx, a 500, the retriever, a bug) are raised at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, replace

from agents.core.episode import AgentContext, Episode
from agents.core.llm import FrozenGenerator, PolicyGenerator, PolicyState
from agents.datasets import PromptRecord
from services.rollout.config import RolloutSettings
from services.rollout.runtime import llm_client
from shared.inference_client import AiohttpCompletions, InferenceClient, InferenceError
from shared.log import get_logger
from shared.retry import Failure, classify

log = get_logger(__name__)


@dataclass(eq=False)
class Server:
    """One policy server as the rollout last saw it. ``version`` None: not probed yet (never picked)."""

    url: str
    static: bool = False  # from the settings: stays a member while not announced
    up: bool = False  # the last probe answered; an episode's transient failure sets it False at once
    version: int | None = None  # weight version it serves (``fleet_watch``), None until probed
    outstanding: int = 0  # episodes running on it now
    episodes: int = 0  # episodes it was given, retried ones included
    failures: int = 0  # episodes that failed here with a transient failure of the server
    member: bool = True  # False once it left (no longer announced): leases still out are released
    loading: bool = False  # the fleet watch is loading the live weights into it: it takes episodes soon

    def eligible(self, live: int) -> bool:
        return self.member and self.up and self.version is not None and self.version >= live

    def status(self) -> dict:
        return {
            "up": self.up,
            "version": self.version,
            "outstanding": self.outstanding,
            "episodes": self.episodes,
            "failures": self.failures,
            "static": self.static,
            "loading": self.loading,
        }


def pick(servers: Iterable[Server], live: int, exclude: Collection[str] = ()) -> Server | None:
    """The server for the next episode (module docstring), or None when no server may take one."""
    candidates = [s for s in servers if s.eligible(live) and s.url not in exclude]
    return min(candidates, key=lambda s: (s.outstanding, s.episodes, s.url), default=None)


class Fleet:
    """Members, leases and waiting for a server. One event loop, no locks.

    ``acquire`` leases a server to one episode (``release`` gives it back); it waits while no member may take
    the episode but one might soon (down, behind or not probed yet), for at most ``timeout_s``, and past it
    while the watch is still loading the live weights into a member: after each announcement every server is
    behind until its load, and a full reload of a large model can take longer than ``timeout_s``.
    """

    def __init__(self, static_urls: Iterable[str], live: Callable[[], int]) -> None:
        self.live = live
        self.servers: dict[str, Server] = {}
        for url in static_urls:
            url = normalize(url)
            self.servers.setdefault(url, Server(url, static=True))
        self._changed = asyncio.Event()  # set whenever a server may have become eligible
        self.restarts = 0  # episodes started again on another server after theirs failed

    def set_announced(self, urls: Iterable[str]) -> None:
        """The servers announced now: new ones join (unprobed), those gone leave unless the settings list them."""
        announced = {normalize(u) for u in urls}
        for url in announced - set(self.servers):
            self.servers[url] = Server(url)
        for url, server in list(self.servers.items()):
            if not server.static and url not in announced:
                server.member = False
                del self.servers[url]

    def observe(self, url: str, *, up: bool, version: int | None = None) -> None:
        """A probe's result: answered or not, and the weight version served (kept when ``version`` is None)."""
        server = self.servers.get(normalize(url))
        if server is None:  # it left while the probe ran
            return
        server.up = up
        if version is not None:
            server.version = version
        self._notify()

    def set_loading(self, url: str, loading: bool) -> None:
        """The watch started (True) or ended (False) a load of the live weights into ``url``."""
        server = self.servers.get(normalize(url))
        if server is not None:
            server.loading = loading
            self._notify()

    def loading(self, exclude: Collection[str] = ()) -> bool:
        """Whether a load into a member not in ``exclude`` is under way (worth waiting for)."""
        return any(s.loading and s.member and s.url not in exclude for s in self.servers.values())

    def failed(self, server: Server) -> None:
        """An episode met a transient failure of ``server``: no new episodes there until a probe answers."""
        server.up = False
        server.failures += 1

    def lease(self, exclude: Collection[str] = ()) -> Server | None:
        """A server for one episode, counted as outstanding there until ``release``; None when none may take it."""
        server = pick(self.servers.values(), self.live(), exclude)
        if server is not None:
            server.outstanding += 1
            server.episodes += 1
        return server

    def release(self, server: Server) -> None:
        # No wake-up for waiters: load decides which eligible server is picked, never whether one is.
        server.outstanding -= 1

    def hopeless(self, exclude: Collection[str]) -> bool:
        """True when every member is excluded: waiting cannot help this episode."""
        return all(url in exclude for url in self.servers)

    async def acquire(self, exclude: Collection[str] = (), timeout_s: float = 30.0) -> Server | None:
        """``lease``, waiting up to ``timeout_s`` for a server to become eligible; None after that, or at once
        when every member is excluded."""
        deadline = time.monotonic() + timeout_s
        while True:
            server = self.lease(exclude)
            if server is not None or self.hopeless(exclude):
                return server
            left = deadline - time.monotonic()
            if left <= 0:
                if not self.loading(exclude):
                    return None
                left = 1.0  # a load under way (the watch bounds it): look again when it ends, or in a second
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    def eligible(self) -> list[Server]:
        live = self.live()
        return [s for s in self.servers.values() if s.eligible(live)]

    def _notify(self) -> None:
        self._changed.set()

    def status(self) -> dict:
        return {
            "live_version": self.live(),
            "restarted_episodes": self.restarts,
            "servers": {url: s.status() for url, s in sorted(self.servers.items())},
        }


def normalize(url: str) -> str:
    """One spelling per server: the settings' ``http://h:8002/`` and an announced ``http://h:8002`` are one."""
    return url.strip().rstrip("/")


log = get_logger(__name__)


class FleetRunner:
    """``await run(record) -> Episode`` on the fleet; ``classify`` names the server an httpx error came from."""

    def __init__(
        self,
        settings: RolloutSettings,
        ctx: AgentContext,
        fleet: Fleet,
        *,
        answers: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.s, self.ctx, self.fleet = settings, ctx, fleet
        self.agent = settings.agent_spec  # resolved once, not for every episode
        # What ``classify`` names an httpx error by; "inference" is replaced by the episode's own server.
        self.services = {
            "inference": settings.inference_url,
            "retriever": settings.retriever_url,
            "searcher": settings.searcher_url,
        }
        self.answers = answers  # the outage gate's probe of "inference": does any server take episodes?
        self.clients: dict[str, InferenceClient | AiohttpCompletions] = {}
        self.contexts: dict[str, tuple[tuple[int, str, str], AgentContext]] = {}  # url → (version key, context)

    def _client(self, url: str) -> InferenceClient | AiohttpCompletions:
        if url not in self.clients:
            self.clients[url] = llm_client(self.s, url)
        return self.clients[url]

    def episode_context(self, server: Server) -> AgentContext:
        """``ctx`` with its generators bound to ``server`` and to the live version as it is now.

        One context per server and version, made at the first episode that needs it and shared by the episodes
        after it (as the single-URL path shares ``ctx``): nothing in it belongs to one episode, and making it
        per episode was a measurable part of the fleet's cost at hundreds of episodes a second."""
        live = self.ctx.policy
        if not isinstance(live, PolicyGenerator):
            raise TypeError(f"the fleet runs a PolicyGenerator's episodes, not {type(live).__name__}'s")
        state = live.state
        key = (state.version, state.model_name, state.served_model_name)
        cached = self.contexts.get(server.url)
        if cached is not None and cached[0] == key:
            return cached[1]
        pinned = PolicyState(*key)
        client = self._client(server.url)
        policy = PolicyGenerator(client, pinned, live.sampling, live.behind_wait_s, live.behind_retry_s)
        frozen = self.ctx.frozen
        if isinstance(frozen, FrozenGenerator):  # the same server: its prefix cache has the episode
            frozen = FrozenGenerator(client, frozen.model, frozen.sampling)
        ctx = replace(self.ctx, policy=policy, frozen=frozen)
        self.contexts[server.url] = (key, ctx)  # the older version's context goes: its episodes hold their own
        return ctx

    async def run(self, record: PromptRecord) -> Episode:
        tried: set[str] = set()
        last: BaseException | None = None
        for attempt in range(self.s.episode_attempts):
            server = await self.fleet.acquire(tried, self.s.server_wait_s)
            if server is None:
                break
            if attempt:
                self.fleet.restarts += 1
            try:
                return await self.agent.run(self.episode_context(server), record)
            except Exception as exc:
                if not self.server_failed(exc, server.url):
                    raise
                self.fleet.failed(server)
                tried.add(server.url)
                last = exc
                log.warning(
                    "policy server failed mid-episode; the episode starts over elsewhere if it can",
                    extra={
                        "server": server.url,
                        "prompt_id": record.prompt_id,
                        "attempt": attempt + 1,
                        "error": repr(exc)[:200],
                    },
                )
            finally:
                self.fleet.release(server)
        if last is not None:
            raise last
        # A 503 is what it is: no server serves now (all down or behind the live version). Transient, so the
        # producer re-queues the prompt uncounted and pauses admission until a server takes episodes again.
        raise InferenceError(
            503,
            f"no policy server is up and serving version {self.fleet.live()} after {self.s.server_wait_s:g} s "
            f"(servers: {sorted(self.fleet.servers) or 'none'})",
        )

    def server_failed(self, exc: BaseException, url: str) -> bool:
        """True when ``exc`` is a transient failure of the policy server at ``url`` (not of another service)."""
        failure = classify(exc, {**self.services, "inference": url})
        return failure.service == "inference" and failure.transient

    def classify(self, exc: BaseException) -> Failure:
        """``shared.retry.classify`` with ``inference`` meaning whichever fleet server an httpx error came
        from (the aiohttp transport's errors are the LLM's anyway)."""
        url = str(exc.request.url) if getattr(exc, "_request", None) is not None else ""
        server = next((u for u in self.clients if url.startswith(u)), self.services.get("inference", ""))
        return classify(exc, {**self.services, "inference": server})

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()
