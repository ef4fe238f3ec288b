"""Group-relative advantages (GRPO, Dr. GRPO, RLOO) with role-aware baselines. numpy only.

Rows are keyed by a globally unique group id (``TrajectoryGroup.group_id``), never by a per-source dataset
index (upstream's key collided across sources or put a whole batch in one group; ``docs/upstream.md``). One
scalar per row; the
trainer broadcasts it over the row's trained tokens.

Estimators, for a group g with rewards R_1..R_G:
  grpo:    A_i = (R_i − mean_g) / (std_g + ε)   (std unbiased (Bessel, as Search-R1 and CoDA) or population)
  dr_grpo: A_i = R_i − mean_g                   (no std: no difficulty re-weighting)
  rloo:    A_i = R_i − mean_{j≠i} R_j = G/(G−1) · (R_i − mean_g)
  rft:     A_i = 1 if R_i ≥ threshold else 0        (rejection-sampling fine-tuning: on-policy, with the
           ratio at 1, the loss is the NLL of the policy's own correct samples; no baseline, so a group
           all right still teaches, and one all wrong does not)
A group of one row has no baseline: its advantage is 0 and it is reported as degenerate.

Roles (hierarchical agents; executors carry ``parent_id`` = their planner's ``sample_id``):
  inherit:  baseline over the group's non-executor rows; each executor copies its planner's advantage
            (CoDA's rule: executors are judged by the outcome of the planner episode they served).
  per_role: separate baselines per (group, role): planners against planners, executors against executors.
  pooled:   every row of the group in one baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from shared.protocol.trajectory import RoleMode, flat

if TYPE_CHECKING:
    from shared.protocol.trajectory import TrajectoryGroup

Estimator = Literal["grpo", "dr_grpo", "rloo", "rft"]
StdKind = Literal["unbiased", "population"]


@dataclass
class AdvantageResult:
    """``advantages`` aligned with the input rows; ``zero_variance`` lists baseline keys whose rewards were all
    equal (no learning signal) and ``singleton`` those with a single row."""

    advantages: np.ndarray
    zero_variance: list[str] = field(default_factory=list)
    singleton: list[str] = field(default_factory=list)

    @property
    def num_zero_variance(self) -> int:
        return len(self.zero_variance)


def normalise_group(
    rewards: np.ndarray,
    estimator: Estimator = "grpo",
    std: StdKind = "unbiased",
    eps: float = 1e-6,
    threshold: float = 0.5,
) -> np.ndarray:
    """Advantages of ONE group's rewards (see the module docstring for the formulas; ``threshold``: rft's)."""
    r = np.asarray(rewards, dtype=np.float64)
    if estimator == "rft":
        return (r >= threshold).astype(np.float64)
    n = r.shape[0]
    if n < 2:
        return np.zeros_like(r)
    centred = r - r.mean()
    if estimator == "dr_grpo":
        return centred
    if estimator == "rloo":
        return centred * n / (n - 1)
    if estimator == "grpo":
        denom = r.std(ddof=1 if std == "unbiased" else 0) + eps
        # All-equal rewards with ε = 0 would be 0/0; the centred rewards are 0 there, so is the advantage.
        return centred / denom if denom > 0 else np.zeros_like(r)
    raise ValueError(f"unknown advantage estimator {estimator!r}")


def group_advantages(
    rewards: Sequence[float],
    keys: Sequence[str],
    estimator: Estimator = "grpo",
    std: StdKind = "unbiased",
    eps: float = 1e-6,
    threshold: float = 0.5,
) -> AdvantageResult:
    """Advantages with one baseline per distinct key (rows need not be contiguous). Under ``rft`` a key
    without a correct row is the one with no signal (``zero_variance``), whatever its spread."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.shape[0] != len(keys):
        raise ValueError(f"{r.shape[0]} rewards for {len(keys)} group keys")
    out = np.zeros_like(r)
    result = AdvantageResult(out)
    index: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        index.setdefault(k, []).append(i)
    for key, rows in index.items():
        values = r[rows]
        if estimator == "rft":
            out[rows] = normalise_group(values, estimator, threshold=threshold)
            if not out[rows].any():
                result.zero_variance.append(key)
            continue
        if len(rows) < 2:
            result.singleton.append(key)
        elif flat(values.tolist()):  # the one definition of "no signal", shared with the rollout
            result.zero_variance.append(key)
            continue  # exactly 0 (the mean of equal floats may be off by an ulp): the trainer skips such rows
        out[rows] = normalise_group(values, estimator, std, eps)
    return result


def role_advantages(
    rewards: Sequence[float],
    group_ids: Sequence[str],
    roles: Sequence[str],
    sample_ids: Sequence[str],
    parent_ids: Sequence[str | None],
    mode: RoleMode = "inherit",
    estimator: Estimator = "grpo",
    std: StdKind = "unbiased",
    eps: float = 1e-6,
    threshold: float = 0.5,
) -> AdvantageResult:
    """Advantages for rows of several roles, with the role ``mode`` from the module docstring.

    In ``inherit`` mode an executor whose ``parent_id`` is not among the rows is an error (the trajectory
    group validator already guarantees parents are present in well-formed groups).
    """
    n = len(rewards)
    if not (len(group_ids) == len(roles) == len(sample_ids) == len(parent_ids) == n):
        raise ValueError("rewards, group_ids, roles, sample_ids and parent_ids must have the same length")
    if mode == "pooled":
        return group_advantages(rewards, group_ids, estimator, std, eps, threshold)
    if mode == "per_role":
        keys = [f"{g}/{r}" for g, r in zip(group_ids, roles, strict=True)]
        return group_advantages(rewards, keys, estimator, std, eps, threshold)
    if mode != "inherit":
        raise ValueError(f"unknown role mode {mode!r}")
    top = [i for i in range(n) if roles[i] != "executor"]
    sub = group_advantages([rewards[i] for i in top], [group_ids[i] for i in top], estimator, std, eps, threshold)
    out = np.zeros(n, dtype=np.float64)
    out[top] = sub.advantages
    by_id = {sample_ids[i]: out[i] for i in top}
    for i in range(n):
        if roles[i] == "executor":
            parent = parent_ids[i]
            if parent not in by_id:
                raise ValueError(f"executor {sample_ids[i]} has parent {parent!r}, which is not a planner row")
            out[i] = by_id[parent]
    return AdvantageResult(out, sub.zero_variance, sub.singleton)


def trajectory_advantages(
    groups: Sequence[TrajectoryGroup],
    mode: RoleMode = "inherit",
    estimator: Estimator = "grpo",
    std: StdKind = "unbiased",
    eps: float = 1e-6,
    threshold: float = 0.5,
) -> tuple[dict[str, float], AdvantageResult]:
    """``role_advantages`` over every sample of ``groups``: ``({sample_id: advantage}, result)``.

    Sample ids are only unique within a group, so the returned keys are ``f"{group_id}/{sample_id}"``.
    """
    rows = [(g.group_id, s) for g in groups for s in g.samples]
    result = role_advantages(
        [s.reward for _, s in rows],
        [g for g, _ in rows],
        [s.role for _, s in rows],
        [f"{g}/{s.sample_id}" for g, s in rows],
        [None if s.parent_id is None else f"{g}/{s.parent_id}" for g, s in rows],
        mode,
        estimator,
        std,
        eps,
        threshold,
    )
    return {f"{g}/{s.sample_id}": float(a) for (g, s), a in zip(rows, result.advantages, strict=True)}, result
