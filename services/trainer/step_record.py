"""One optimizer step's record (``metrics.StepRecord``: a line of ``train.jsonl``, the Prometheus gauges, the
plots) from what the step did: its losses and RED state, the reward and each of its components averaged over
the step's samples, staleness and the queue.

The record's fields are defined (named, described, marked gauge or plotted) in ``services.trainer.metrics``;
bench/ scripts, the stack's report and alerts, the Grafana panels and tests read them, so a rename there is a
rename for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from services.trainer.checkpoint import TrainState
from services.trainer.metrics import RedMetrics, StepRecord
from services.trainer.rl.red import REDWeights
from services.trainer.step import StepResult
from shared.protocol import TrajectoryGroup, WeightUpdate
from shared.stream import QueueStats, staleness


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
) -> StepRecord:
    """The record of the step ``state`` has just counted. ``seconds``: the whole step, reading included;
    ``publish``: this step's publish, if it published; ``sync_diff``: the sync check after it, if one ran."""
    rec = StepRecord(
        step=state.step,
        version=state.version,
        step_seconds=seconds,
        seconds=result.seconds,
        tokens_per_second=result.metrics.tokens / max(result.seconds, 1e-9),
        tokens=result.metrics.tokens,
        total_tokens=state.tokens,
        rl_tokens=result.rl_tokens,
        rl_sequences=result.rl_sequences,
        sft_tokens=result.sft_tokens,
        micro_batches=float(result.micro_batches),
        rl=result.metrics.rl.means(),
        # A mean that was not measured (no RL token, no SFT) is None: left out.
        rl_entropy=result.rl_entropy(),
        sft_entropy=result.sft_entropy(),
        sft_loss=result.sft_loss(),
        grad_norm=result.grad_norm,
        lr=result.lr,
        groups=0,
    )
    if red is not None:
        rec.red = _red(red)
    elif result.sft_micro_batches:
        # SFT without RED (``sft_only``): the coefficient it trained with, under RED's name for it.
        rec.red = RedMetrics(sft_loss_weight=result.sft_weight)
    if rollouts is not None:
        _add_rollouts(rec, rollouts, state)
    if publish is not None:
        rec.publish_seconds = publish.publish_seconds
        rec.sync_max_abs_diff = sync_diff
    return rec


def signal_share(groups: int, zero_variance_groups: int) -> float | None:
    """The share of ``groups`` with a learning signal (rewards not all equal); None without groups."""
    return 1.0 - zero_variance_groups / groups if groups else None


def _red(red: REDWeights) -> RedMetrics:
    # REDWeights and RedMetrics share their fields' names; an accuracy not measured (no planner row) logs as −1.
    out = RedMetrics(**{f.name: getattr(red, f.name) for f in fields(RedMetrics)})
    if out.batch_accuracy is None:
        out.batch_accuracy = -1.0
    return out


def _add_rollouts(rec: StepRecord, rollouts: Rollouts, state: TrainState) -> None:
    samples = [smp for g in rollouts.groups for smp in g.samples]
    rewards = [smp.reward for smp in samples]
    components: dict[str, list[float]] = {}
    for smp in samples:
        for k, v in smp.reward_components.items():
            components.setdefault(k, []).append(v)
    rec.rewards = {k: float(np.mean(v)) for k, v in components.items()}
    rec.reward_mean = float(np.mean(rewards))
    rec.reward_std = float(np.std(rewards))
    rec.groups = len(rollouts.groups)
    rec.zero_variance_groups = rollouts.zero_variance_groups
    rec.signal_share = signal_share(len(rollouts.groups), rollouts.zero_variance_groups)
    rec.dropped_stale = state.dropped_stale  # the run's total so far
    rec.dropped_stale_step = rollouts.dropped_stale
    rec.skipped_zero_advantage = rollouts.skipped_zero_advantage
    rec.staleness_max = max(staleness(g.policy_version, state.version) for g in rollouts.groups)
    rec.queue_lag = rollouts.queue.lag
    rec.queue_pending = rollouts.queue.pending
