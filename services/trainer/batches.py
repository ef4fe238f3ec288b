"""From the ``trajectories`` stream to training sequences on every rank: collect a step's groups on rank 0,
hand them to all ranks (``Ranks``), filter stale samples.

Reading follows the stream's at-least-once contract. After a restart the consumer first gets its own
unacknowledged entries again; the ones the resumed checkpoint already contains (``TrainState.covered``)
are acknowledged on the spot and not trained twice, the others are trained again.

A group the model cannot train on although it validates (``group_check``: a token id outside the
vocabulary would crash the embedding on every restart) is dead-lettered at read time. Redis outages are
waited out (``shared.retry``); a stop cuts the wait short and ``collect`` returns what it has.

The trainer's ranks stay together: one decision per step, bounded waits, a clean end when one is lost.

Rank 0 alone reads Redis and talks to the inference server; the others wait for it in collectives. Every
collective has a timeout (``collective_timeout_s``, set on every process group, DeepSpeed's own included),
so a rank that died, hangs or is cut off ends the job instead of hanging it. Waiting for groups is not
such a wait: rank 0 reads in a thread and all ranks meet every ``POLL_S``, so a slow rollout or a Redis
outage never looks like a lost rank. At the same meetings the ranks agree to stop when any of them was told
to (torchrun forwards SIGTERM only to its own node's workers), so they all leave the loop at the same step
and write the last checkpoint together.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import TypeVar

import torch

from services.trainer.packing import TrainSeq
from shared.log import get_logger
from shared.protocol import TrajectoryGroup
from shared.retry import DependencyDown, Patience
from shared.stream import Entry, StreamQueue, sample_staleness, token_staleness, too_stale

log = get_logger(__name__)


class GroupReader:
    """Collects ``n`` groups per step from the consumer group, skipping entries already trained.

    Entries stay pending across several reads (they are acked only after a checkpoint). The queue serves each
    pending entry of this consumer once after a start: the whole backlog is taken at start-up and served from
    here; later reads take new entries.
    """

    def __init__(
        self,
        queue: StreamQueue[TrajectoryGroup],
        covered: list[str],
        block_ms: int = 1000,
        check: Callable[[TrajectoryGroup], None] | None = None,
        patience: Patience | None = None,
    ) -> None:
        """``check`` raises ``ValueError`` for a group to dead-letter (installed on ``queue``)."""
        self.queue = queue
        self.block_ms = block_ms
        self.patience = patience or Patience()
        if check is not None:
            queue.check = check  # before the backlog is read: a pending bad group must not crash a restart
        wait = self.patience.call
        wait("redis", self.queue.ensure_group)
        # The trainer is the group's only consumer: entries another consumer name left pending (a renamed or
        # replaced trainer) become ours, so they are trained (or acked, if covered) instead of stuck.
        wait("redis", self.queue.claim, min_idle_ms=0, count=1_000_000)
        pending = wait("redis", self.queue.pending_ids, self.queue.consumer)
        backlog = wait("redis", self.queue.read, count=len(pending)) if pending else []
        done = [e.id for e in backlog if e.id in set(covered)]
        if done:
            log.info("acknowledging groups the checkpoint already contains", extra={"count": len(done)})
            wait("redis", self.queue.ack, *done)
        self.backlog = deque(e for e in backlog if e.id not in set(done))
        if self.backlog:
            log.info("retraining groups whose effect was not checkpointed", extra={"count": len(self.backlog)})

    def collect(self, n: int, stop: threading.Event | None = None) -> list[Entry[TrajectoryGroup]]:
        """Block until ``n`` groups are in hand (or ``stop`` is set: then what there is)."""
        got: list[Entry[TrajectoryGroup]] = []
        while self.backlog and len(got) < n:
            got.append(self.backlog.popleft())
        while len(got) < n and not (stop and stop.is_set()):
            try:
                got += self.patience.call("redis", self.queue.read, count=n - len(got), block_ms=self.block_ms)
            except DependencyDown:
                if not (stop and stop.is_set()):
                    raise
                log.warning("stopping while Redis is down", extra={"groups_in_hand": len(got)})
        return got


def group_check(vocab_size: int) -> Callable[[TrajectoryGroup], None]:
    """A check that raises ``ValueError`` for a group this model cannot train on, though it validates.

    Cheap invariants the schema cannot know (it checks lengths and masks): token ids inside the embedding
    table, and finite logprobs and rewards (one NaN would turn the weights into NaN).
    """

    def check(group: TrajectoryGroup) -> None:
        for s in group.samples:
            bad = [t for t in s.token_ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(
                    f"sample {s.sample_id}: token id {bad[0]} outside the model's vocabulary of {vocab_size}"
                )
            if not all(map(math.isfinite, s.logprobs)):
                raise ValueError(f"sample {s.sample_id}: non-finite logprob")
            if not all(map(math.isfinite, [s.reward, *s.reward_components.values()])):
                raise ValueError(f"sample {s.sample_id}: non-finite reward")

    return check


def teaching(seqs: list[TrainSeq], keep_one: bool = False) -> tuple[list[TrainSeq], int]:
    """The sequences whose advantage is not 0, re-indexed, and how many were left out.

    Without a KL or entropy term a sample with advantage 0 (every reward of its group equal, or its reward
    exactly the group's mean) has no gradient: its forward and backward would cost as much as any other
    sample's and teach nothing (DAPO's dynamic sampling leaves such groups out for the same reason).
    ``keep_one``: where every sample has advantage 0, keep the one with the fewest tokens, so that the step
    still happens (its gradient is exactly 0, and the optimizer moves as it would on the whole batch).
    """
    kept = [s for s in seqs if any(a != 0.0 for a in s.fields["adv"])]
    if keep_one and not kept and seqs:
        kept = [min(seqs, key=lambda s: len(s.tokens))]
    return [replace(s, index=i) for i, s in enumerate(kept)], len(seqs) - len(kept)


def to_sequences(
    groups: list[TrajectoryGroup], advantages: dict[str, float], version: int, max_staleness: int, policy: str
) -> tuple[list[TrainSeq], int]:
    """One ``TrainSeq`` per trainable sample with per-token fields ``old_logp``, ``adv`` and ``staleness``.

    ``advantages`` maps ``"group_id/sample_id"`` to the sample's advantage, computed on the full groups
    before anything is dropped (a stale sample does not move its group's baseline). Samples with no trained
    token, and stale samples under the ``drop`` policy, are left out. Returns the sequences and the number
    of samples dropped as stale.
    """
    seqs: list[TrainSeq] = []
    dropped = 0
    for g in groups:
        for s in g.samples:
            if not s.num_trained_tokens:
                continue
            if policy == "drop" and too_stale(sample_staleness(s, version), max_staleness):
                dropped += 1
                continue
            adv = advantages[f"{g.group_id}/{s.sample_id}"]
            n = len(s.token_ids)
            seqs.append(
                TrainSeq(
                    tokens=list(s.token_ids),
                    mask=list(s.loss_mask),
                    index=len(seqs),
                    fields={"old_logp": list(s.logprobs), "adv": [adv] * n, "staleness": token_staleness(s, version)},
                )
            )
    return seqs, dropped


# ---------------------------------------------------------------- the ranks
T = TypeVar("T")
POLL_S = 1.0  # how often waiting ranks meet while rank 0 waits for groups (well under any collective timeout)


def set_collective_timeout(seconds: float) -> None:
    """Bound every collective of every process group (the world's and those DeepSpeed created) to ``seconds``.

    ``new_group`` gives a group the backend's default (30 min for gloo), not the world group's timeout, so
    the timeout passed at init alone would leave DeepSpeed's gradient all-reduce unbounded for 30 minutes.
    """
    from torch.distributed import distributed_c10d as c10d

    for group in list(c10d._world.pg_map):
        c10d._set_pg_timeout(timedelta(seconds=seconds), group)


def lost_rank(exc: BaseException) -> bool:
    """True when ``exc`` is a collective that failed because another rank died, hung or became unreachable
    (gloo raises plain ``RuntimeError``s naming its transport; NCCL and the store raise ``DistError``s)."""
    if isinstance(exc, torch.distributed.DistError):
        return True
    return isinstance(exc, RuntimeError) and "gloo" in str(exc).lower()


class Ranks:
    """This process's place in the job, and the few collectives the loop makes itself."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def broadcast(self, obj: T | None) -> T:
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on at least one."""
        if self.world == 1:
            return flag
        value = torch.tensor([int(flag)])
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return bool(value.item())

    def gather_work(self, read: Callable[[], list[T]] | None, stop: threading.Event) -> list[T]:
        """Rank 0's ``read()`` (blocking until it has a step's worth, or until ``stop`` is set) on every rank;
        ``[]`` on every rank once any rank's ``stop`` is set (what rank 0 had read stays pending in Redis and
        is delivered again to the next start). ``read`` is None on ranks other than 0."""
        if self.world == 1:
            return read()
        done = threading.Event()
        result: dict = {}
        if self.rank == 0:
            threading.Thread(target=_run_into, args=(read, result, done), name="group-reader", daemon=True).start()
        while True:
            if self.rank == 0:
                done.wait(POLL_S)
            stopping = self.any(stop.is_set())
            if self.rank == 0 and stopping:
                stop.set()  # the job stops: cut rank 0's read (and its waits for Redis) short
                done.wait()
            ready = self.rank == 0 and done.is_set()
            if ready and "error" in result:
                raise result["error"]
            verdict = self.broadcast(("stop" if stopping else "go", result.get("value")) if ready else None)
            if verdict is not None:
                what, value = verdict
                return [] if what == "stop" else value


def _run_into(fn: Callable[[], T], result: dict, done: threading.Event) -> None:
    try:
        result["value"] = fn()
    except BaseException as exc:  # handed to the loop's thread, which raises it
        result["error"] = exc
    finally:
        done.set()
