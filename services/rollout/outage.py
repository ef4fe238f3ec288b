"""Back off while a dependency is down instead of burning prompts on it.

A group that fails because the LLM, the retriever, the searcher or Redis is unreachable, timing out or
answering 502/503/504/429 (a transient failure, ``shared.retry``) failed through no fault of its prompt:
every prompt would fail the same way until the dependency returns. So such a failure does not count against
the prompt (it goes back to the queue) and the ``DependencyGate`` pauses admission of new groups, probing the
dependency with exponential backoff (0.5 s → 10 s) until it answers again. Failures that are the prompt's own (a 4xx, a 500, a reward bug) still
count: a prompt that makes a server fail (500) is dropped after a few tries instead of pausing the rollout
again and again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx

from shared.log import get_logger
from shared.retry import Failure

log = get_logger(__name__)

DEPENDENCIES = ("inference", "retriever", "searcher", "redis")
Probe = Callable[[str], Awaitable[bool]]


def outage_dependency(failure: Failure) -> str | None:
    """The dependency a failure blames when it is an outage (``retriever`` for a refused connection to the
    retriever); None for failures that are the prompt's own (``inference_http_404``, ``retriever_http_500``,
    a bug) and for transient failures of an HTTP call to no named dependency (nothing to probe)."""
    if failure.service not in DEPENDENCIES:
        return None
    # Any Redis error: publishing a group to Redis fails alike for every prompt, so it is never the prompt's
    # (a transient one or not: an out-of-memory Redis refuses every XADD until the trainer catches up).
    return failure.service if failure.transient or failure.service == "redis" else None


async def http_answers(base_url: str, timeout_s: float = 5.0) -> bool:
    """True when the service at ``base_url`` answers ``/health`` below 500 (a server without the route
    still proves it is up with its 404; a 503 is a server that is not ready yet). A health check, not a
    request that failed: its own 500 says the server is unhealthy, so ``shared.retry`` does not apply."""
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
