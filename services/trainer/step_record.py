"""One optimizer step's record for the JSONL log, the plots and the dashboards: the step's losses and RED
state, the reward and each of its components averaged over the step's samples, staleness and the queue.

Every key is a quantity ``services.trainer.metrics`` defines (the record is checked against it): bench/
scripts, the stack's report, the alerts, the Grafana panels and tests read them by those names, and the
Prometheus gauges are named after them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.trainer.checkpoint import TrainState
from services.trainer.metrics import check_keys
from services.trainer.rl.red import REDWeights
from services.trainer.step import StepResult
from shared.protocol import TrajectoryGroup, WeightUpdate
from shared.staleness import staleness
from shared.stream import QueueStats


@dataclass(frozen=True)
class Rollouts:
    """What an RL step's groups were and what became of them (an SFT-only step has none)."""

    groups: list[TrajectoryGroup]
    zero_variance_groups: int  # groups whose rewards were all equal (advantage 0)
    dropped_stale: int  # samples of this step dropped for staleness
    skipped_zero_advantage: int  # samples left out for having advantage 0
    queue: QueueStats  # the stream after the step's groups were read


def step_record(
    result: StepResult,
    state: TrainState,
    seconds: float,
    *,
    red: REDWeights | None = None,
    rollouts: Rollouts | None = None,
    publish: WeightUpdate | None = None,
    sync_diff: float | None = None,
) -> dict[str, float]:
    """The record of the step ``state`` has just counted. ``seconds``: the whole step, reading included;
    ``publish``: this step's publish, if it published; ``sync_diff``: the sync check after it, if one ran."""
    rec: dict[str, float] = {**result.metrics.rl.means(), **_step_fields(result)}
    if red is not None:
        rec.update(_red_fields(red))
    elif result.sft_micro_batches:
        # SFT without RED (``sft_only``): the coefficient it trained with, under RED's name for it.
        rec["red/sft_loss_weight"] = result.sft_weight
    rec.update(_rollout_fields(rollouts, state) if rollouts is not None else {"groups": 0})
    rec.update(
        step=state.step,
        version=state.version,
        step_seconds=seconds,
        tokens_per_second=result.metrics.tokens / max(result.seconds, 1e-9),
        total_tokens=state.tokens,
    )
    if publish is not None:
        rec["publish_seconds"] = publish.publish_seconds
        if sync_diff is not None:
            rec["sync_max_abs_diff"] = sync_diff
    check_keys(rec)
    return rec


def _step_fields(result: StepResult) -> dict[str, float]:
    """What the optimizer step measured; a mean that was not measured (no RL token, no SFT) is left out."""
    means = {"rl_entropy": result.rl_entropy(), "sft_entropy": result.sft_entropy(), "sft_loss": result.sft_loss()}
    return {
        "tokens": result.metrics.tokens,
        **{k: v for k, v in means.items() if v is not None},
        "rl_tokens": result.rl_tokens,
        "rl_sequences": result.rl_sequences,
        "sft_tokens": result.sft_tokens,
        "micro_batches": float(result.micro_batches),
        "grad_norm": result.grad_norm,
        "lr": result.lr,
        "seconds": result.seconds,
    }


def _red_fields(red: REDWeights) -> dict[str, float]:
    out = {
        "red/entropy_weight": red.entropy_weight,
        "red/accuracy_factor": red.accuracy_factor,
        "red/final_weight": red.final_weight,
        "red/sft_loss_weight": red.sft_loss_weight,
        "red/batch_accuracy": -1.0 if red.batch_accuracy is None else red.batch_accuracy,
    }
    emas = {"h_rl": red.h_rl, "h_rl_prev": red.h_rl_prev, "h_sft": red.h_sft, "h_sft_prev": red.h_sft_prev}
    return out | {f"red/{k}": v for k, v in emas.items() if v is not None}


def _rollout_fields(rollouts: Rollouts, state: TrainState) -> dict[str, float]:
    samples = [smp for g in rollouts.groups for smp in g.samples]
    rewards = [smp.reward for smp in samples]
    components: dict[str, list[float]] = {}
    for smp in samples:
        for k, v in smp.reward_components.items():
            components.setdefault(f"reward/{k}", []).append(v)
    return {
        **{k: float(np.mean(v)) for k, v in components.items()},
        "reward_mean": float(np.mean(rewards)),
        "reward_std": float(np.std(rewards)),
        "groups": len(rollouts.groups),
        "zero_variance_groups": rollouts.zero_variance_groups,
        "dropped_stale": state.dropped_stale,  # the run's total so far
        "dropped_stale_step": rollouts.dropped_stale,
        "skipped_zero_advantage": rollouts.skipped_zero_advantage,
        "staleness_max": max(staleness(g.policy_version, state.version) for g in rollouts.groups),
        "queue_lag": rollouts.queue.lag,
        "queue_pending": rollouts.queue.pending,
    }
