"""Staleness by admission: a new group may start only while the trainer can still use it in time.

With ``v`` the live policy version and ``g`` groups per optimizer step, the trainer at step ``v`` accepts
data sampled by versions ``v − s … v`` (``s = max_staleness``). So at most ``(s + v + 1)·g`` groups may ever
have been started; ``accepted + running`` have been. A bump of the version releases ``g`` more. With
``s = 0`` this is strict on-policy training: exactly one step's worth of groups per version.
Nothing sampled is thrown away for being stale: it is never started in the first place.
"""

from __future__ import annotations

import asyncio
import time


def admission_capacity(max_staleness: int, version: int, groups_per_step: int, accepted: int, running: int) -> int:
    """How many more groups may start now: ``(s + v + 1)·g − (accepted + running)`` (≤ 0: none)."""
    return (max_staleness + version + 1) * groups_per_step - (accepted + running)


class Admission:
    """The admission gate of one rollout process (asyncio; one event loop)."""

    def __init__(self, max_staleness: int, groups_per_step: int, *, version: int = 0, accepted: int = 0,
                 max_running: int | None = None) -> None:
        self.max_staleness, self.groups_per_step = max_staleness, groups_per_step
        self.max_running = max_running
        self.version, self.accepted, self.running = version, accepted, 0
        self._changed = asyncio.Condition()

    @property
    def capacity(self) -> int:
        return admission_capacity(self.max_staleness, self.version, self.groups_per_step, self.accepted,
                                  self.running)

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
