"""A typed queue over Redis Streams (publish, consume with a consumer group, ack, recover after crashes), and
the staleness rule on both sides of the trajectory stream.

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
served (the admission mark's ``consumed``, below).

Staleness, decided here once (``staleness`` and below): how many versions data lags behind, and what ``max_staleness`` allows, to
the trainer (what it may train) and to the rollout (what it may start: admission).

Data sampled by policy version ``u`` and trained (or looked at) when version ``v`` is live is ``v − u``
versions stale; never less than 0 (data from weights newer than the reader's view is as fresh as it gets).
The contract's ``max_staleness`` ``s`` (``shared.contract``) bounds it on both sides of the stream:

- the trainer at version ``v`` trains samples at most ``s`` versions stale (``too_stale``: the others are
  dropped under ``stale_policy = "drop"``);
- the rollout never starts a group the trainer could not use in time: admission, the rule and the mark below
  (the rollout's one gate, ``services.rollout.admission``, applies it).

A sample's staleness is that of its oldest trained token (an episode can span a weight update); a group's,
for the rollout's metrics, that of its oldest sample.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgpack
import redis
from pydantic import BaseModel, ValidationError

from shared.contract import DEFAULT_CONTRACT
from shared.log import get_logger
from shared.protocol import AdmissionMark, Sample, TrajectoryGroup

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


# ---------------------------------------------------------------- staleness
def staleness(sampled: int | None, live: int) -> int:
    """Versions ``sampled`` lags behind ``live`` (0 when it does not, or when nothing was sampled)."""
    return 0 if sampled is None else max(0, live - sampled)


def too_stale(lag: int, max_staleness: int) -> bool:
    """Whether data ``lag`` versions stale is beyond what the contract lets the trainer use."""
    return lag > max_staleness


def sample_staleness(sample: Sample, live: int) -> int:
    """Staleness of ``sample``'s oldest trained token (0 when it trains no token)."""
    return staleness(sample.min_version(), live)


def token_staleness(sample: Sample, live: int) -> list[float]:
    """Per token: its staleness if it is trained, else 0 (the trainer's per-token ``lag`` field)."""
    return [float(staleness(v, live)) if m else 0.0 for v, m in zip(sample.versions, sample.loss_mask, strict=True)]


def group_staleness(group: TrajectoryGroup, live: int) -> int:
    """Staleness of the oldest trained token of any sample of ``group`` (0 when none is trained)."""
    return max((sample_staleness(s, live) for s in group.samples), default=0)


# ---------------------------------------------------------------- admission
# Admission, decided here once: the rule that bounds how many groups the rollout may start, and the mark
# (``AdmissionMark``) that feeds it. The rollout's one gate (``services.rollout.admission``) applies the rule;
# the trainer writes the mark, the rollout reads it.
#
# The rule: at most ``consumed + (s + 1)·g`` groups may ever have been started (``admission_limit``), where
# ``s`` is the contract's ``max_staleness``, ``g`` its ``groups_per_step`` and ``consumed`` the number of
# published groups the trainer had taken when the live version went live (the mark; ``v·g`` at version ``v``
# before the trainer wrote one, which is what it is in a run without restarts). Published plus running groups
# have been started. So no group starts that the trainer could not train within ``s`` versions of the weights
# that sample it, and nothing sampled is thrown away for being stale: it is never started in the first place.
# With ``s = 0`` this is strict on-policy training: one step's worth of groups per version. Counting the groups
# taken, not versions, is what keeps the promise through trainer restarts (retrained steps bump the version
# without taking new groups), foreign groups and steps that trained nothing.
#
# The mark: only the trainer writes it (``services.trainer.publish``, in the transaction that announces each
# version, and after a step that published none); only the rollout reads it (its ``WeightFollower``, which
# hands ``consumed`` to the gate once it serves the mark's version, so a strict on-policy run never samples
# with weights older than the mark promises). ``AdmissionMarks`` is the only code that touches the key.
#
# ``consumed`` (``taken``) is counted in the rollout's own unit, its publish counter: ``published −
# undelivered``, where ``undelivered`` is the number of stream entries the trainer's consumer group has not been
# served yet (``shared.stream.served_count``, which reads both atomically), less the backlog a restarted trainer
# retrains (delivered, but not yet taken: counting it would let the rollout start groups at the resumed version
# that the retraining steps then leave more than ``s`` behind). Entries served but not yet acknowledged
# (pending: trained and awaiting a checkpoint) count as consumed: they are in the trainer's hands and need no
# new groups. Foreign entries (pushed by anything but the rollout) are not in the counter; while they wait
# undelivered they make ``consumed`` smaller (the rollout waits a little longer), and once taken they cost the
# rollout nothing.


def admission_limit(max_staleness: int, version: int, groups_per_step: int, consumed: int | None = None) -> int:
    """How many groups may have been started in all: ``consumed + (s + 1)·g`` (``consumed`` unknown: ``v·g``)."""
    base = version * groups_per_step if consumed is None else consumed
    return base + (max_staleness + 1) * groups_per_step


def admission_capacity(
    max_staleness: int, version: int, groups_per_step: int, accepted: int, running: int, consumed: int | None = None
) -> int:
    """How many more groups may start now: the limit minus ``accepted + running`` (≤ 0: none)."""
    return admission_limit(max_staleness, version, groups_per_step, consumed) - (accepted + running)


def taken(client: Any, stream: str, group: str, counter_key: str, retraining: int = 0) -> int:
    """The mark's ``consumed``: published groups consumer group ``group`` has been served, less the
    ``retraining`` backlog a restarted trainer has not taken yet (never below 0)."""
    return max(0, served_count(client, stream, group, counter_key) - retraining)


class AdmissionMarks:
    """The admission mark under ``key`` in Redis: ``write`` (the trainer's side), ``read`` (the rollout's)."""

    def __init__(self, client: Any, key: str = DEFAULT_CONTRACT.admission_key) -> None:
        """``client``: a redis client (or the trainer's outage-waiting wrapper of one)."""
        self.client = client
        self.key = key

    def write(self, version: int, consumed: int, pipe: Any = None) -> None:
        """Record that ``consumed`` published groups were taken when ``version`` went live; into ``pipe``
        (a transaction the caller executes) when given, so the mark goes out together with the version."""
        (self.client if pipe is None else pipe).set(
            self.key, AdmissionMark(version=version, consumed=consumed).model_dump_json()
        )

    def read(self) -> AdmissionMark | None:
        """The trainer's last mark, or None when it never wrote one (then the rule falls back to versions).
        Raises ``ValueError`` for a value that is not a mark."""
        raw = self.client.get(self.key)
        return None if raw is None else AdmissionMark.model_validate_json(raw)
