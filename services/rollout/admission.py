"""The rollout's admission of new groups: one starts only while the staleness rule allows it (``Admission``)
and while its dependencies answer (``DependencyGate``).

The rule and the trainer's mark that feeds it are defined in ``shared.stream`` (the one explanation and
formula); this module only counts what the rule needs (``accepted``: published groups, ``running``: groups
started and not finished) and makes episodes wait for a free slot. ``Admission`` is one process's gate;
``RedisAdmission`` is the same gate shared by several rollout processes.

While a dependency is down the rollout backs off instead of burning prompts on it. A group that fails because the LLM, the retriever, the searcher or Redis is unreachable, timing out or
answering 502/503/504/429 (a transient failure, ``shared.retry``) failed through no fault of its prompt:
every prompt would fail the same way until the dependency returns. So such a failure does not count against
the prompt (it goes back to the queue) and the ``DependencyGate`` pauses admission of new groups, probing the
dependency with exponential backoff (0.5 s → 10 s) until it answers again. Failures that are the prompt's own (a 4xx, a 500, a reward bug) still
count: a prompt that makes a server fail (500) is dropped after a few tries instead of pausing the rollout
again and again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import httpx

from shared.contract import DEFAULT_CONTRACT
from shared.log import get_logger
from shared.retry import Failure
from shared.stream import admission_capacity, admission_limit

log = get_logger(__name__)


class Admission:
    """The admission gate of one rollout process (asyncio; one event loop)."""

    def __init__(
        self,
        max_staleness: int,
        groups_per_step: int,
        *,
        version: int = 0,
        accepted: int = 0,
        max_running: int | None = None,
    ) -> None:
        self.max_staleness, self.groups_per_step = max_staleness, groups_per_step
        self.max_running = max_running
        self.version, self.accepted, self.running = version, accepted, 0
        self.consumed: int | None = None  # the trainer's admission mark; None: derived from the version
        self._changed = asyncio.Condition()

    @property
    def limit(self) -> int:
        return admission_limit(self.max_staleness, self.version, self.groups_per_step, self.consumed)

    @property
    def capacity(self) -> int:
        return admission_capacity(
            self.max_staleness, self.version, self.groups_per_step, self.accepted, self.running, self.consumed
        )

    def can_start(self) -> bool:
        return self.capacity > 0 and (self.max_running is None or self.running < self.max_running)

    async def acquire(self) -> float:
        """Wait for a free slot and take it; returns the seconds waited."""
        start = time.perf_counter()
        async with self._changed:
            await self._changed.wait_for(self.can_start)
            self.running += 1
        return time.perf_counter() - start

    async def release(self, published: bool) -> None:
        """A group finished: published groups count as accepted; a failed one frees its slot."""
        async with self._changed:
            self.running -= 1
            self.accepted += int(published)
            self._changed.notify_all()

    async def set_version(self, version: int) -> None:
        async with self._changed:
            if version > self.version:
                self.version = version
                self._changed.notify_all()

    async def set_consumed(self, consumed: int) -> None:
        """The trainer's count of groups taken (it only grows within a stream's life, but a restarted
        trainer that finds foreign groups waiting may report fewer: the limit follows either way)."""
        async with self._changed:
            if consumed != self.consumed:
                self.consumed = consumed
                self._changed.notify_all()


# Atomically: if published + Σ running(live workers) < limit, take a slot for this worker. A worker is live
# while its heartbeat is newer than the cutoff; a dead worker's slots stop counting (and are dropped).
_ACQUIRE = """
local published = tonumber(redis.call('GET', KEYS[1]) or '0')
local beats = redis.call('HGETALL', KEYS[3])
local running = 0
for i = 1, #beats, 2 do
  if tonumber(beats[i + 1]) >= tonumber(ARGV[3]) then
    running = running + tonumber(redis.call('HGET', KEYS[2], beats[i]) or '0')
  else
    redis.call('HDEL', KEYS[2], beats[i])
    redis.call('HDEL', KEYS[3], beats[i])
  end
end
if published + running < tonumber(ARGV[1]) then
  redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
  return 1
end
return 0
"""


class RedisAdmission(Admission):
    """The same gate shared by several rollout processes: ``accepted`` is the Redis publish counter and
    ``running`` is summed over the live workers (each keeps a heartbeat), so replicas together never start
    more than ``(s + v + 1)·g`` groups. Waiting polls Redis every ``poll_s`` (and wakes on local events)."""

    def __init__(
        self,
        client,
        worker: str,
        max_staleness: int,
        groups_per_step: int,
        *,
        version: int = 0,
        max_running: int | None = None,
        published_key: str = DEFAULT_CONTRACT.published_key,
        prefix: str = "rollout",
        heartbeat_ttl_s: float = 30.0,
        poll_s: float = 0.1,
    ) -> None:
        super().__init__(max_staleness, groups_per_step, version=version, max_running=max_running)
        self.r, self.worker, self.poll_s, self.ttl = client, worker, poll_s, heartbeat_ttl_s
        self.keys = [published_key, f"{prefix}:running", f"{prefix}:heartbeat"]
        self._script = client.register_script(_ACQUIRE)
        self.heartbeat()

    def heartbeat(self) -> None:
        self.r.hset(self.keys[2], self.worker, time.time())

    def _try(self) -> bool:
        limit = self.limit
        if self.max_running is not None and self.running >= self.max_running:
            return False
        return bool(self._script(keys=self.keys, args=[limit, self.worker, time.time() - self.ttl]))

    async def acquire(self) -> float:
        start = time.perf_counter()
        while True:
            self.heartbeat()
            if await asyncio.to_thread(self._try):
                self.running += 1
                return time.perf_counter() - start
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), self.poll_s)

    async def release(self, published: bool) -> None:
        # The publish counter itself is INCRed by the producer right after XADD; only the slot is ours.
        await asyncio.to_thread(self.r.hincrby, self.keys[1], self.worker, -1)
        self.accepted = int(await asyncio.to_thread(self.r.get, self.keys[0]) or 0)
        await super().release(published=False)


# Waiting out a dependency's outage

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
