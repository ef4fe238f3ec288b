"""From the ``trajectories`` stream to training sequences: collect a step's groups, filter stale samples.

Reading follows the stream's at-least-once contract. After a restart the consumer first gets its own
unacknowledged entries again; the ones the resumed checkpoint already contains (``TrainState.covered``)
are acknowledged on the spot and not trained twice, the others are trained again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from services.trainer.packing import TrainSeq
from shared.log import get_logger
from shared.protocol import Sample, TrajectoryGroup
from shared.stream import Entry, StreamQueue

log = get_logger(__name__)


class GroupReader:
    """Collects ``n`` groups per step from the consumer group, skipping entries already trained."""

    def __init__(self, queue: StreamQueue[TrajectoryGroup], covered: list[str], block_ms: int = 1000) -> None:
        self.queue = queue
        self.covered = set(covered)
        self.block_ms = block_ms
        self.queue.ensure_group()

    def collect(self, n: int, stop: threading.Event | None = None,
                on_wait: Callable[[], None] | None = None) -> list[Entry[TrajectoryGroup]]:
        """Block until ``n`` groups are in hand (or ``stop`` is set: then what there is)."""
        got: list[Entry[TrajectoryGroup]] = []
        while len(got) < n and not (stop and stop.is_set()):
            entries = self.queue.read(count=n - len(got), block_ms=self.block_ms)
            done = [e.id for e in entries if e.id in self.covered]
            if done:
                log.info("acknowledging groups the checkpoint already contains", extra={"count": len(done)})
                self.queue.ack(*done)
                self.covered.difference_update(done)
            got += [e for e in entries if e.id not in done]
            if not entries and on_wait:
                on_wait()
        return got


def sample_lag(sample: Sample, version: int) -> int:
    """How many versions behind ``version`` the oldest trained token of ``sample`` is (0 when none)."""
    oldest = sample.min_version()
    return 0 if oldest is None else max(0, version - oldest)


def to_sequences(groups: list[TrajectoryGroup], advantages: dict[str, float], version: int,
                 max_staleness: int, policy: str) -> tuple[list[TrainSeq], int]:
    """One ``TrainSeq`` per trainable sample with per-token fields ``old_logp``, ``adv`` and ``lag``.

    ``advantages`` maps ``"group_id/sample_id"`` to the sample's advantage, computed on the full groups
    before anything is dropped (a stale sample does not move its group's baseline). Samples with no trained
    token, and stale samples under the ``drop`` policy, are left out. Returns the sequences and the number
    of samples dropped as stale.
    """
    seqs: list[TrainSeq] = []
    dropped = 0
    for g in groups:
        for s in g.samples:
            lag = sample_lag(s, version)
            if not s.num_trained_tokens:
                continue
            if lag > max_staleness and policy == "drop":
                dropped += 1
                continue
            adv = advantages[f"{g.group_id}/{s.sample_id}"]
            n = len(s.token_ids)
            token_lag = [float(max(0, version - v)) if m else 0.0 for v, m in zip(s.versions, s.loss_mask, strict=True)]
            seqs.append(TrainSeq(tokens=list(s.token_ids), mask=list(s.loss_mask), index=len(seqs),
                                 fields={"old_logp": list(s.logprobs), "adv": [adv] * n, "lag": token_lag}))
    return seqs, dropped
