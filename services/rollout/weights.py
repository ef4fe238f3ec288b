"""Follows the trainer's weight events so new requests use the newest policy.

On start it reads ``policy:version``; then it tails the ``weights`` stream (plain ``XREAD`` from the
newest entry: every rollout process must see every event, so no consumer group). A LoRA event switches
requests to the adapter's model name (``<served>-<run>-v{N}``); a full reload keeps the base name and only bumps
the version. After each read it also looks at the trainer's admission mark (how many groups it has taken)
and hands it on once this process serves the mark's version: that is what opens the admission gate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import redis

from agents.core.llm import PolicyState
from shared.contract import DEFAULT_CONTRACT
from shared.log import get_logger
from shared.protocol import WeightUpdate
from shared.stream import AdmissionMarks, decode

log = get_logger(__name__)


class WeightFollower:
    def __init__(
        self,
        client: redis.Redis,
        state: PolicyState,
        *,
        stream: str = DEFAULT_CONTRACT.weights_stream,
        version_key: str = DEFAULT_CONTRACT.version_key,
        admission_key: str = DEFAULT_CONTRACT.admission_key,
        on_version: Callable[[int], Awaitable[None]] | None = None,
        on_consumed: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        self.r, self.state, self.stream, self.version_key = client, state, stream, version_key
        self.marks = AdmissionMarks(client, admission_key)  # read only: the trainer writes it
        self.on_version, self.on_consumed = on_version, on_consumed
        self.last_id = "0-0"
        self.event: WeightUpdate | None = None  # the newest event: where the live weights are (fleet sync)

    async def start(self) -> None:
        """Catch up: the last event on the stream (its model name), then the version key."""
        last = await asyncio.to_thread(self.r.xrevrange, self.stream, count=1)
        if last:
            entry_id, fields = last[0]
            self.last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            await self.apply(decode(WeightUpdate, fields))
        raw = await asyncio.to_thread(self.r.get, self.version_key)
        if raw is not None and int(raw) > self.state.version:
            # The key is ahead of the stream (e.g. trimmed): a full-weight version under the base name.
            await self._advance(int(raw), None)
        await self.check_mark()

    async def check_mark(self) -> None:
        """Pass the trainer's admission mark on, once the version it was written with is the one we use."""
        if self.on_consumed is None:
            return
        try:
            mark = await asyncio.to_thread(self.marks.read)
        except ValueError as exc:
            log.error("bad admission mark ignored", extra={"key": self.marks.key, "error": str(exc)[:200]})
            return
        if mark is not None and mark.version <= self.state.version:
            await self.on_consumed(mark.consumed)

    async def apply(self, event: WeightUpdate) -> None:
        if self.event is None or event.version >= self.event.version:
            self.event = event
        await self._advance(event.version, event.model_name if event.kind == "lora" else None)

    async def _advance(self, version: int, model_name: str | None) -> None:
        if self.state.advance(version, model_name):
            log.info("policy version advanced", extra={"version": version, "model": self.state.model_name})
            if self.on_version:
                await self.on_version(version)

    async def run(self, block_ms: int = 1000) -> None:
        """Tail the stream forever (cancel to stop); bad events are logged and skipped."""
        while True:
            try:
                reply = await asyncio.to_thread(self.r.xread, {self.stream: self.last_id}, count=100, block=block_ms)
            except redis.RedisError as exc:  # Redis restarting: keep the last id, try again shortly
                log.warning("weights stream unreachable, retrying", extra={"error": repr(exc)[:200]})
                await asyncio.sleep(1.0)
                continue
            for _, rows in reply or []:
                for entry_id, fields in rows:
                    self.last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                    try:
                        event = decode(WeightUpdate, fields)
                    except ValueError as exc:
                        log.error("bad weight event skipped", extra={"entry": self.last_id, "error": str(exc)})
                        continue
                    await self.apply(event)
            try:
                await self.check_mark()
            except redis.RedisError as exc:
                log.warning("admission mark unreachable, retrying", extra={"error": repr(exc)[:200]})
