"""One optimizer step's record for the JSONL log, the plots and the dashboards: the step's losses and RED
state, the reward and each of its components averaged over the step's samples, staleness and the queue."""

from __future__ import annotations

from typing import Any

import numpy as np

from services.trainer.batch_loss import finish
from services.trainer.checkpoint import TrainState
from shared.protocol import TrajectoryGroup


def step_record(
    out: dict,
    groups: list[TrajectoryGroup],
    red: dict,
    state: TrainState,
    stats: Any,
    *,
    zero_var: int,
    dropped: int,
    seconds: float,
    publish: Any = None,
    sync_diff: float | None = None,
) -> dict[str, float]:
    """``stats``: the stream's (lag, pending); ``publish``: this step's publish, if it published."""
    rewards = [smp.reward for g in groups for smp in g.samples]
    components: dict[str, list[float]] = {}
    for g in groups:
        for smp in g.samples:
            for k, v in smp.reward_components.items():
                components.setdefault(f"reward/{k}", []).append(v)
    lags = [max(0, state.version - g.policy_version) for g in groups]
    rec = {**finish(out), **red, **{k: float(np.mean(v)) for k, v in components.items()}}
    rec.update(
        step=state.step,
        version=state.version,
        step_seconds=seconds,
        tokens_per_second=out["tokens"] / max(out["seconds"], 1e-9),
        reward_mean=float(np.mean(rewards)),
        reward_std=float(np.std(rewards)),
        groups=len(groups),
        zero_variance_groups=zero_var,
        dropped_stale=state.dropped_stale,
        dropped_stale_step=dropped,
        staleness_max=max(lags),
        queue_lag=stats.lag,
        queue_pending=stats.pending,
        total_tokens=state.tokens,
    )
    if publish is not None:
        rec["publish_seconds"] = publish.publish_seconds
        if sync_diff is not None:
            rec["sync_max_abs_diff"] = sync_diff
    return rec
