"""Back off while a dependency is down instead of burning prompts on it.

A group that fails because the LLM, the retriever, the searcher or Redis is unreachable, timing out or
answering 502/503/504/429 failed through no fault of its prompt: every prompt would fail the same way until the
dependency returns. So such a failure does not count against the prompt (it goes back to the queue) and
the ``DependencyGate`` pauses admission of new groups, probing the dependency with exponential backoff
(0.5 s → 10 s) until it answers again. Failures that are the prompt's own (a 4xx, a reward bug) still count.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx

from shared.log import get_logger

log = get_logger(__name__)

DEPENDENCIES = ("inference", "retriever", "searcher", "redis")
Probe = Callable[[str], Awaitable[bool]]
# A server that answers but is not serving (restarting, behind a proxy, overloaded). Not 500: a server that
# is up and fails one request after the client's retries most likely fails that request, and counting it
# lets a prompt that crashes a server be dropped instead of pausing the rollout again and again.
OUTAGE_STATUS = ("http_429", "http_502", "http_503", "http_504")


def outage_dependency(cause: str) -> str | None:
    """The dependency an outage label of ``failure_cause`` blames (``retriever_unreachable`` → ``retriever``);
    None for failures that are the prompt's own (``inference_http_404``, ``retriever_http_500``, a bug)."""
    name, _, how = cause.partition("_")
    if name not in DEPENDENCIES:
        return None
    # "redis_error": publishing a group to Redis fails alike for every prompt, so it is never the prompt's.
    return name if how in ("unreachable", "timeout", "error") or how in OUTAGE_STATUS else None


async def http_answers(base_url: str, timeout_s: float = 5.0) -> bool:
    """True when the service at ``base_url`` answers ``/health`` below 500 (a server without the route
    still proves it is up with its 404; a 503 is a server that is not ready yet)."""
    root = base_url.rstrip("/").removesuffix("/retrieve")  # Search-R1 configs give the full route
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            return (await client.get(root + "/health")).status_code < 500
    except httpx.HTTPError:
        return False


class DependencyGate:
    """Holds admission while a dependency is down: ``down()`` on an outage failure, ``await wait()`` before
    each new group, ``ok()`` when a group succeeded. One event loop; no locks needed."""

    def __init__(self, probe: Probe, metrics, *, first_s: float = 0.5, max_s: float = 10.0) -> None:
        self.probe, self.metrics, self.first_s, self.max_s = probe, metrics, first_s, max_s
        self.waiting_for: str | None = None
        self.cause: str | None = None
        self._since = 0.0
        self._resumed = 0.0  # groups started before this were caught by the outage already handled
        # Kept across a resume until a group succeeds: a dependency whose /health answers while its real
        # route still fails is then probed at a growing interval, not every 0.5 s.
        self._delay = first_s

    def down(self, dependency: str, cause: str, started: float) -> None:
        """A group started at ``started`` (``time.perf_counter``) failed because ``dependency`` is down."""
        if self.waiting_for is not None or started < self._resumed:
            return  # already paused, or a straggler of the outage we just came back from
        self.waiting_for, self.cause, self._since = dependency, cause, time.perf_counter()
        self.metrics.waiting.labels(dependency).set(1)
        self.metrics.outages.labels(dependency).inc()
        log.warning(
            "dependency down; pausing new groups until it answers",
            extra={"dependency": dependency, "cause": cause, "first_probe_s": self._delay},
        )

    def ok(self) -> None:
        """A group succeeded: the next outage starts probing at ``first_s`` again."""
        self._delay = self.first_s

    async def wait(self) -> None:
        """Return at once without an outage; otherwise probe with exponential backoff until it answers."""
        while self.waiting_for is not None:
            await asyncio.sleep(self._delay)
            self._delay = min(2 * self._delay, self.max_s)
            if await self.probe(self.waiting_for):
                self._resume()

    def _resume(self) -> None:
        down_s = round(time.perf_counter() - self._since, 2)
        self.metrics.waiting.labels(self.waiting_for).set(0)
        self.metrics.paused_seconds.inc(down_s)
        log.info("dependency answers again; resuming", extra={"dependency": self.waiting_for, "down_s": down_s})
        self.waiting_for, self.cause, self._resumed = None, None, time.perf_counter()

    def status(self) -> dict:
        return {
            "waiting_for": self.waiting_for,
            "outage_cause": self.cause,
            "outage_s": round(time.perf_counter() - self._since, 2) if self.waiting_for else None,
        }
