"""From the ``trajectories`` stream to training sequences: collect a step's groups, filter stale samples.

Reading follows the stream's at-least-once contract. After a restart the consumer first gets its own
unacknowledged entries again; the ones the resumed checkpoint already contains (``TrainState.covered``)
are acknowledged on the spot and not trained twice, the others are trained again.

A group the model cannot train on although it validates (``group_check``: a token id outside the
vocabulary would crash the embedding on every restart) is dead-lettered at read time. Redis outages are
waited out (``services.trainer.outage``); a stop cuts the wait short and ``collect`` returns what it has.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from services.trainer.outage import DependencyDown, Patience
from services.trainer.packing import TrainSeq
from shared.log import get_logger
from shared.protocol import TrajectoryGroup
from shared.staleness import sample_staleness, token_staleness, too_stale
from shared.stream import Entry, StreamQueue

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
