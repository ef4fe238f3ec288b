"""The rollout's admission gate: a new group starts only while the rule of ``shared.staleness`` allows it.

The rule and the trainer's mark that feeds it are defined in ``shared.staleness`` (the one explanation and
formula); this module only counts what the rule needs (``accepted``: published groups, ``running``: groups
started and not finished) and makes episodes wait for a free slot. ``Admission`` is one process's gate;
``RedisAdmission`` is the same gate shared by several rollout processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from shared.contract import DEFAULT_CONTRACT
from shared.staleness import admission_capacity, admission_limit


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
