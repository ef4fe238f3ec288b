"""Staleness, decided here once: how many versions data lags behind, and what ``max_staleness`` allows.

Data sampled by policy version ``u`` and trained (or looked at) when version ``v`` is live is ``v − u``
versions stale; never less than 0 (data from weights newer than the reader's view is as fresh as it gets).
The contract's ``max_staleness`` ``s`` (``shared.contract``) bounds it on both sides of the stream:

- the trainer at version ``v`` trains samples at most ``s`` versions stale (``too_stale``: the others are
  dropped under ``stale_policy = "drop"``);
- the rollout never starts a group the trainer could not use in time: that rule, admission, lives in
  ``shared.admission``.

A sample's staleness is that of its oldest trained token (an episode can span a weight update); a group's,
for the rollout's metrics, that of its oldest sample.
"""

from __future__ import annotations

from shared.protocol import Sample, TrajectoryGroup


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
