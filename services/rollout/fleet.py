"""The rollout's fleet of policy servers: which server gets the next episode (no I/O here).

The rollout samples from every server it knows: the recipe's (``inference_url`` and ``inference_urls``) and
those that announce themselves in Redis (``shared.server_registry``); ``services.rollout.fleet_watch`` keeps
this module's view of them fresh (who is up, which weight version each serves) and
``services.rollout.fleet_runner`` runs episodes on the servers it hands out.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass


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
