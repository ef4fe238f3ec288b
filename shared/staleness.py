"""Staleness, decided here once: how many versions data lags behind, and what ``max_staleness`` allows, to
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

from typing import Any

from shared.contract import DEFAULT_CONTRACT
from shared.protocol import AdmissionMark, Sample, TrajectoryGroup
from shared.stream import served_count


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
