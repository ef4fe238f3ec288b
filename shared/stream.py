"""A typed queue over Redis Streams: publish, consume with a consumer group, ack, recover after crashes.

Delivery is at-least-once. A consumer that dies before ``ack`` leaves its entries pending: restarted under
the same name it gets them again (after a start, ``read`` serves each of its own pending entries once, before
new ones; entries it reads and has not acked yet are not served twice within one run), and another
consumer can ``claim`` them once they have been idle long enough. A message that does not decode or validate
(nor pass the consumer's own ``check``, e.g. token ids within its model's vocabulary) is moved to the
dead-letter stream ``<stream>:dead`` with the reason, then acknowledged: it never crashes the consumer and is
never dropped silently. A read that fails (Redis gone or timing out) may have delivered entries whose reply
was lost; the next read serves them from the pending list.

Messages are msgpack-encoded pydantic models under the field ``data``.

``served_count`` tells a producer that counts what it publishes how much of it a consumer group has been
served (the admission mark's ``consumed``, ``shared.staleness``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import msgpack
import redis
from pydantic import BaseModel, ValidationError

from shared.log import get_logger

log = get_logger(__name__)

M = TypeVar("M", bound=BaseModel)
DATA = b"data"
TYPE = b"type"


def encode(message: BaseModel) -> dict[bytes, bytes]:
    """Stream fields for one message (compact msgpack of the model's JSON-mode dump)."""
    payload = msgpack.packb(message.model_dump(mode="json"), use_bin_type=True)
    return {TYPE: type(message).__name__.encode(), DATA: payload}


def decode(model: type[M], fields: dict[bytes, bytes]) -> M:
    """The message in ``fields``; raises ``ValueError`` with the reason when it is malformed."""
    if DATA not in fields:
        raise ValueError(f"no '{DATA.decode()}' field (fields: {sorted(k.decode(errors='replace') for k in fields)})")
    try:
        doc = msgpack.unpackb(fields[DATA], raw=False)
    except (msgpack.UnpackException, ValueError) as exc:
        raise ValueError(f"not msgpack: {exc}") from exc
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        raise ValueError(f"does not validate as {model.__name__}: {exc}") from exc


@dataclass(frozen=True)
class Entry(Generic[M]):
    """A delivered message with its stream id (needed to ``ack``)."""

    id: str
    message: M


@dataclass(frozen=True)
class QueueStats:
    depth: int  # entries in the stream
    pending: int  # delivered to the group, not yet acknowledged
    lag: int  # entries not yet delivered to the group
    dead_letters: int  # entries in the dead-letter stream


class StreamQueue(Generic[M]):
    """One stream of ``model`` messages, optionally consumed as ``consumer`` of consumer group ``group``.

    ``check`` (optional) raises ``ValueError`` for a message that validates but that this consumer cannot
    process; such a message is dead-lettered like a malformed one.
    """

    def __init__(
        self,
        client: redis.Redis,
        stream: str,
        model: type[M],
        *,
        group: str | None = None,
        consumer: str | None = None,
        maxlen: int | None = 100_000,
        approximate: bool = True,
        check: Callable[[M], None] | None = None,
    ) -> None:
        self.r = client
        self.stream = stream
        self.dead_stream = f"{stream}:dead"
        self.model = model
        self.group = group
        self.consumer = consumer
        self.maxlen = maxlen
        self.approximate = approximate
        self.check = check
        self._recovering = True  # serve this consumer's own pending entries first after (re)start …
        self._cursor = "0"  # … each once: the pending list is walked forward from this id (the last one served)

    # ---------------------------------------------------------------- producing
    def publish(self, message: M) -> str:
        """Append ``message``; the stream is trimmed to about ``maxlen`` entries. Returns the entry id."""
        if not isinstance(message, self.model):
            raise TypeError(f"expected {self.model.__name__}, got {type(message).__name__}")
        entry_id = self.r.xadd(self.stream, encode(message), maxlen=self.maxlen, approximate=self.approximate)
        return entry_id.decode() if isinstance(entry_id, bytes) else entry_id

    # ---------------------------------------------------------------- consuming
    def ensure_group(self, start_id: str = "0") -> None:
        """Create the consumer group (and the stream) if missing; ``start_id="0"`` reads from the beginning."""
        self._require_consumer()
        try:
            self.r.xgroup_create(self.stream, self.group, id=start_id, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read(self, count: int = 1, block_ms: int | None = None) -> list[Entry[M]]:
        """Up to ``count`` messages: first this consumer's unacknowledged ones, then new ones.

        ``block_ms`` waits for new entries (None: do not block). Malformed entries go to the dead-letter
        stream and are not returned.
        """
        self._require_consumer()
        try:
            while self._recovering:
                entries, last = self._read_group(self._cursor, count, None)
                if last is None:
                    self._recovering = False
                    break
                self._cursor = last
                if entries:
                    return entries
            entries, last = self._read_group(">", count, block_ms)
        except redis.RedisError:
            # Redis may have delivered entries before the failure (a timeout, a dropped connection): they are
            # pending for us now and no ">" read serves them again. Ids only grow, so they are exactly the
            # pending ones after the last entry served: walk the pending list from there on the next read.
            self._recovering = True
            raise
        if last is not None:
            self._cursor = last
        return entries

    def ack(self, *entry_ids: str) -> int:
        """Acknowledge processed entries; they leave the pending list for good."""
        self._require_consumer()
        return self.r.xack(self.stream, self.group, *entry_ids) if entry_ids else 0

    def claim(self, min_idle_ms: int, count: int = 100) -> list[Entry[M]]:
        """Take over entries that another (dead) consumer has held unacknowledged for ``min_idle_ms``."""
        self._require_consumer()
        reply = self.r.xautoclaim(
            self.stream, self.group, self.consumer, min_idle_time=min_idle_ms, start_id="0-0", count=count
        )
        claimed = reply[1]
        deleted = reply[2] if len(reply) > 2 else []
        if deleted:  # trimmed by MAXLEN before anyone processed them (Redis ≥ 7 reports them)
            log.warning("pending entries were trimmed before processing", extra={"count": len(deleted)})
            self.ack(*[_text(i) for i in deleted])
        return self._decode_entries(claimed)

    def pending_ids(self, consumer: str | None = None) -> list[str]:
        """Ids of entries delivered but not acknowledged (for one consumer, or the whole group)."""
        self._require_consumer()
        rows = self.r.xpending_range(self.stream, self.group, min="-", max="+", count=1_000_000, consumername=consumer)
        return [_text(row["message_id"]) for row in rows]

    # ---------------------------------------------------------------- observing
    def stats(self) -> QueueStats:
        """Depth, pending, lag and dead letters, for metrics and the supervisor."""
        depth = self.r.xlen(self.stream)
        dead = self.r.xlen(self.dead_stream)
        pending = lag = 0
        if self.group:
            for info in self.r.xinfo_groups(self.stream) if depth or self.r.exists(self.stream) else []:
                if _text(info["name"]) != self.group:
                    continue
                pending = int(info["pending"])
                lag = info.get("lag")
                if lag is None:  # Redis < 7 has no lag field: count what lies after last-delivered-id
                    last = _text(info["last-delivered-id"])
                    lag = len(self.r.xrange(self.stream, min=f"({last}", max="+", count=100_000))
        return QueueStats(depth=depth, pending=pending, lag=int(lag or 0), dead_letters=dead)

    def dead_letters(self, count: int = 100) -> list[dict[str, str]]:
        """The most recent dead-letter records (source id, reason, type)."""
        rows = self.r.xrevrange(self.dead_stream, count=count)
        return [
            {k.decode(): v.decode(errors="replace") for k, v in fields.items() if k != b"raw"} | {"id": _text(i)}
            for i, fields in rows
        ]

    # ---------------------------------------------------------------- internals
    def _require_consumer(self) -> None:
        if not (self.group and self.consumer):
            raise RuntimeError("this queue was opened for publishing only: pass group= and consumer=")

    def _read_group(self, start: str, count: int, block_ms: int | None) -> tuple[list[Entry[M]], str | None]:
        """Decoded entries and the id of the last raw row (None when the reply was empty)."""
        reply = self.r.xreadgroup(self.group, self.consumer, {self.stream: start}, count=count, block=block_ms)
        if not reply or not reply[0][1]:
            return [], None
        _, rows = reply[0]
        last = _text(rows[-1][0])
        if start != ">":
            # Own pending entries whose data was trimmed away come back with empty fields: nothing to redo.
            gone = [_text(i) for i, fields in rows if not fields]
            if gone:
                log.warning("pending entries were trimmed before processing", extra={"count": len(gone)})
                self.ack(*gone)
            rows = [(i, f) for i, f in rows if f]
        return self._decode_entries(rows), last

    def _decode_entries(self, rows) -> list[Entry[M]]:
        out: list[Entry[M]] = []
        for raw_id, fields in rows:
            entry_id = _text(raw_id)
            if not fields:
                continue
            try:
                message = decode(self.model, fields)
                if self.check is not None:
                    self.check(message)
                out.append(Entry(entry_id, message))
            except ValueError as exc:
                self._dead_letter(entry_id, fields, str(exc))
        return out

    def _dead_letter(self, entry_id: str, fields: dict[bytes, bytes], reason: str) -> None:
        log.error(
            "malformed message moved to dead letters",
            extra={"stream": self.stream, "entry": entry_id, "reason": reason[:500]},
        )
        record = {
            b"source_id": entry_id.encode(),
            b"reason": reason[:4000].encode(),
            b"type": fields.get(TYPE, b""),
            b"raw": fields.get(DATA, b""),
        }
        self.r.xadd(self.dead_stream, record, maxlen=10_000, approximate=True)
        self.ack(entry_id)


# KEYS[1]: stream, KEYS[2]: the producer's counter; ARGV[1]: consumer group. Redis ≥ 6.2 (exclusive XRANGE start).
_SERVED = """
local counted = tonumber(redis.call('GET', KEYS[2]) or '0')
if redis.call('EXISTS', KEYS[1]) == 0 then
  return counted
end
local last = nil
for _, info in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, delivered = nil, nil
  for i = 1, #info, 2 do
    if info[i] == 'name' then name = info[i + 1] elseif info[i] == 'last-delivered-id' then delivered = info[i + 1] end
  end
  if name == ARGV[1] then last = delivered end
end
if last == nil then
  return counted - redis.call('XLEN', KEYS[1])
end
return counted - #redis.call('XRANGE', KEYS[1], '(' .. last, '+')
"""


def served_count(client: redis.Redis, stream: str, group: str, counter_key: str) -> int:
    """How many of the entries a producer counted in ``counter_key`` (INCR after each XADD) consumer group
    ``group`` has been served: the counter minus the entries not yet delivered to the group (all of them
    while the group does not exist), both read in one Lua script so that no publish slips in between.

    Served entries count whether acknowledged or still pending. Entries nobody counted (another writer's)
    lower the result while they wait undelivered and cost nothing once delivered.
    """
    return int(client.eval(_SERVED, 2, stream, counter_key, group))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
