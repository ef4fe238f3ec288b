"""Whether a trajectory group teaches anything: decided here once, for the trainer and the rollout.

The trainer's group-relative advantage (``services.trainer.rl.advantages``) normalises each *baseline*, a set of
rows of one group, against its own mean. A baseline whose rows all got the same reward, or that has a single row,
gets an advantage of exactly 0 on every row: no policy-gradient signal. Which rows share a baseline is the
trainer's ``role_baseline``:

  inherit:  the group's non-executor rows (executors copy their planner's advantage);
  per_role: one baseline per role (planners against planners, executors against executors);
  pooled:   every row of the group.

``flat`` is the test on one baseline (the trainer's ``zero_variance``, plus singletons); ``has_signal`` says
whether any baseline of one group is not flat under a mode, or under any mode (``mode=None``). Pure Python,
so the rollout image (no trainer code) and the trainer share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

RoleMode = Literal["inherit", "per_role", "pooled"]
ROLE_MODES: tuple[RoleMode, ...] = ("inherit", "per_role", "pooled")


def flat(rewards: Sequence[float]) -> bool:
    """One baseline's rewards give every row an advantage of exactly 0: fewer than two rows, or all equal
    (compared exactly, as the trainer does: any difference, however small, is normalised into a signal)."""
    values = list(rewards)
    return len(values) < 2 or all(v == values[0] for v in values)


def baselines(rewards: Sequence[float], roles: Sequence[str], mode: RoleMode) -> list[list[float]]:
    """The reward sets of ONE group that the trainer normalises separately under ``mode``."""
    if len(rewards) != len(roles):
        raise ValueError(f"{len(rewards)} rewards for {len(roles)} roles")
    if mode == "pooled":
        return [list(rewards)]
    if mode == "inherit":
        return [[r for r, role in zip(rewards, roles, strict=True) if role != "executor"]]
    if mode == "per_role":
        by_role: dict[str, list[float]] = {}
        for r, role in zip(rewards, roles, strict=True):
            by_role.setdefault(role, []).append(r)
        return list(by_role.values())
    raise ValueError(f"unknown role mode {mode!r}")


def has_signal(rewards: Sequence[float], roles: Sequence[str], mode: RoleMode | None = None) -> bool:
    """Whether ONE group gives some row a nonzero advantage under ``mode``; ``None``: under at least one mode
    (the conservative answer for a reader that does not know the trainer's mode: it never calls a group flat
    that the trainer would learn from; since every baseline is a subset of the pooled one, it is the same as
    "not all rewards of the group are equal")."""
    modes = ROLE_MODES if mode is None else (mode,)
    return any(not flat(values) for m in modes for values in baselines(rewards, roles, m))
