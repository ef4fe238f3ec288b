"""Every RL-health alert, defined once: its name, what it means, what to do, the thresholds it reads, its
PromQL (for ``deploy/prometheus/alerts.yml``) and its check for ``make train`` (``checks``).

The PromQL uses the metric names the services export today (``coda_trainer_*`` gauges of
``services.trainer.observe.GAUGES``, ``coda_rollout_*``, ``coda_policy_version``); the checks read the same
quantities from ``train.jsonl`` and the rollout's ``/metrics``. Where Prometheus cannot see what the log holds,
the PromQL is the nearest exported proxy and ``Rule.prometheus_note`` says how it differs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from launcher.alerts import checks
from launcher.alerts.observed import Observed
from launcher.alerts.settings import AlertSettings


@dataclass(frozen=True)
class Rule:
    name: str  # the Prometheus alertname
    summary: str  # what is wrong, one line
    action: str  # what to look at, what to do
    thresholds: tuple[str, ...]  # the AlertSettings fields it reads
    expr: Callable[[AlertSettings], str]  # PromQL: the series returned are the alerts
    check: Callable[[Observed, AlertSettings], str | None]  # make train's evaluation
    hold: Callable[[AlertSettings], str] = lambda s: "0s"  # Prometheus ``for:``
    severity: str = "warning"
    prometheus_note: str = ""  # how the PromQL differs from the check, where it must


def _w(s: AlertSettings) -> str:
    return f"{s.window_minutes}m"


def _lb(s: AlertSettings) -> str:
    return f"{s.lookback_hours}h"


def _smoothed_reward(s: AlertSettings) -> str:
    return f"avg_over_time(coda_trainer_reward_mean[{_w(s)}])"


def _reward_drop(s: AlertSettings) -> str:
    smooth, lb = _smoothed_reward(s), _lb(s)
    peak, low = f"max_over_time({smooth}[{lb}:1m])", f"min_over_time({smooth}[{lb}:1m])"
    raw, w = "coda_trainer_reward_mean", _w(s)
    noise = f"{s.reward_drop_z:g} * stddev_over_time({raw}[{lb}]) * sqrt(2 / count_over_time({raw}[{w}]))"
    return (
        f"({peak} - {smooth}) > clamp_min({s.reward_drop_fraction:g} * ({peak} - {low}), {s.reward_drop_min:g}) "
        f"and ({peak} - {smooth}) > {noise}"
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "TrainerNotStepping",
        "The trainer has made no optimizer step for many times its median step time.",
        "Is the trainer alive (its log, `/health`)? Is it waiting for groups (rollout, Redis) or for a policy "
        "server to load its weights? A run that reached max_steps also stops stepping.",
        ("stall_factor", "stall_min_s"),
        lambda s: (
            f"(time() - max_over_time(timestamp(changes(coda_trainer_step[2m]) > 0)[{_lb(s)}:15s])) > clamp_min("
            f"{s.stall_factor:g} * quantile_over_time(0.5, coda_trainer_step_seconds[{_lb(s)}]), {s.stall_min_s:g})"
        ),
        checks.trainer_stalled,
        severity="critical",
        prometheus_note="the median is over the scraped samples of the last lookback_hours",
    ),
    Rule(
        "RolloutNotProducing",
        "No trajectory group was published while the trainer's queue is empty: the trainer starves.",
        "Look at the rollout's log and `coda_rollout_failures_total` (by cause), "
        "`coda_rollout_waiting_for_dependency` (a retriever or policy server it waits for) and its admission.",
        ("rollout_stall_s",),
        lambda s: (
            f'sum(increase(coda_rollout_groups_total{{outcome="published"}}[{s.rollout_stall_s:.0f}s])) == 0 '
            "and on() max(coda_trainer_queue_lag) == 0"
        ),
        checks.rollout_stalled,
        severity="critical",
    ),
    Rule(
        "PolicyServerDown",
        "A policy server the rollout samples from does not answer.",
        "Look at that server's log and `/health`; its episodes are retried elsewhere, but the fleet is smaller.",
        ("server_down_s",),
        lambda s: "coda_rollout_server_up == 0",
        checks.server_down,
        hold=lambda s: f"{s.server_down_s:.0f}s",
    ),
    Rule(
        "PolicyServerBehind",
        "A policy server serves weights several versions older than the live policy.",
        "It gets no new episodes until it catches up: look at its weight loading (`coda_inference_weight_update_"
        "seconds`, its log) and the trainer's publish (`coda_trainer_publish_seconds`).",
        ("server_lag_versions", "server_behind_s"),
        lambda s: f"scalar(max(coda_policy_version)) - (coda_rollout_server_version >= 0) >= {s.server_lag_versions}",
        checks.server_behind,
        hold=lambda s: f"{s.server_behind_s:.0f}s",
    ),
    Rule(
        "StaleRollouts",
        "A large share of sampled episodes is dropped as too stale to train on.",
        "Rollouts are sampled with weights too old for max_staleness: the trainer outpaces the policy "
        "servers' reloads, or `[shared] max_staleness` is too strict for this fleet. Look at `coda_trainer_staleness_*`.",
        ("stale_share", "window_steps", "window_minutes"),
        lambda s: (
            f"max(delta(coda_trainer_dropped_stale[{_w(s)}])) / "
            f"sum(increase(coda_rollout_episodes_total[{_w(s)}])) > {s.stale_share:g}"
        ),
        checks.stale_rollouts,
        prometheus_note="dropped samples over the episodes the rollout finished in window_minutes",
    ),
    Rule(
        "SamplerMismatch",
        "The sampler's and the trainer's log-probabilities disagree (mismatch KL or importance weights).",
        "Check the inference server's precision and logprobs mode against the trainer's "
        "(`[inference] logprobs_mode`, `[inference] precision` against `[trainer] precision`), the temperature "
        "both use (`[shared] temperature`), and that the served weights are "
        "the trained ones (`sync_max_abs_diff`). A spike after a weight load points at the load.",
        ("mismatch_kl", "mismatch_spike_factor", "is_weight_deviation", "window_steps", "window_minutes"),
        lambda s: (
            f"avg_over_time(coda_trainer_mismatch_kl_k3[{_w(s)}]) > clamp_min({s.mismatch_spike_factor:g} * "
            f"quantile_over_time(0.5, coda_trainer_mismatch_kl_k3[{_lb(s)}]), {s.mismatch_kl:g}) "
            f"or abs(coda_trainer_is_weight_mean - 1) > {s.is_weight_deviation:g}"
        ),
        checks.mismatch_spike,
    ),
    Rule(
        "EntropyCollapse",
        "The policy's token entropy fell below a fraction of its peak: it stopped exploring.",
        "Lower the learning rate (`[trainer] lr`), add an entropy bonus (`[trainer] entropy_coef`) or clip-higher "
        "(`[trainer] clip_high`), raise the temperature (`[shared] temperature`); "
        "check whether the reward is being hacked with one fixed answer. Not said while the smoothed reward is "
        "at least entropy_solved_reward (a policy that solved its task may stop exploring), nor while it is "
        "entropy_learned_gain above its lowest (the policy grew sure as it learned).",
        (
            "entropy_fraction",
            "entropy_floor",
            "entropy_solved_reward",
            "entropy_learned_gain",
            "window_steps",
            "window_minutes",
        ),
        lambda s: (
            f"coda_trainer_rl_entropy < {s.entropy_fraction:g} * max_over_time(coda_trainer_rl_entropy[{_lb(s)}]) "
            f"and coda_trainer_rl_entropy < {s.entropy_floor:g} "
            f"and {_smoothed_reward(s)} < {s.entropy_solved_reward:g} "
            f"and ({_smoothed_reward(s)} - min_over_time({_smoothed_reward(s)}[{_lb(s)}:1m])) "
            f"< {s.entropy_learned_gain:g}"
        ),
        checks.entropy_collapse,
        prometheus_note="the peak, and the reward it climbed from (the smoothed reward's lowest), are over the last "
        "lookback_hours; make train's check climbs from the mean of the first 3 RL steps",
    ),
    Rule(
        "RewardDrop",
        "The smoothed reward fell well below its running peak: the run is unlearning.",
        "Go back to the checkpoint of the peak; lower the learning rate (`[trainer] lr`); look at the clip fraction, the "
        "mismatch KL and the grad norm around the drop.",
        ("reward_drop_fraction", "reward_drop_min", "reward_drop_z", "window_steps", "window_minutes"),
        _reward_drop,
        checks.reward_drop,
        prometheus_note="smoothed over window_minutes, peak and low over lookback_hours",
    ),
    Rule(
        "NoLearningSignal",
        "Almost every group's rewards are all equal (advantage 0) while the reward is low: GRPO has nothing to "
        "learn from.",
        "The task is too hard for the policy now, or the policy is broken (a learning rate far too high: look at "
        "the grad norm and the demonstration loss): check the reward on a few episodes, give more samples per "
        "prompt (`n_samples`), easier prompts or demonstrations (SFT/RED), or a graded reward. Not said while "
        "the reward is at least no_signal_solved_reward: a solved task's groups are all 1.",
        ("no_signal_share", "no_signal_steps", "no_signal_minutes", "no_signal_solved_reward"),
        lambda s: (
            f"avg_over_time(coda_trainer_signal_share[{s.no_signal_minutes}m]) < {1 - s.no_signal_share:g} "
            f"and coda_trainer_step - coda_trainer_step offset {s.no_signal_minutes}m >= {s.no_signal_steps} "
            f"and avg_over_time(coda_trainer_reward_mean[{s.no_signal_minutes}m]) < {s.no_signal_solved_reward:g}"
        ),
        checks.no_learning_signal,
        prometheus_note=(
            "the share and the reward are averaged over the scrapes of no_signal_minutes (make train weights "
            "steps by their groups), which must hold no_signal_steps steps"
        ),
    ),
    Rule(
        "DemonstrationLossRising",
        "The loss on the demonstrations rises while the policy trains on them: the updates make it worse.",
        "Stop and lower the learning rate (`[trainer] lr`; a warm start whose SFT loss rises from its first "
        "steps is the usual sign of one far too high); look at the grad norm. Later in a run, RL may be pulling "
        "the policy away from the demonstrations: look at RED's weight (`red/sft_loss_weight`).",
        ("sft_rise_factor", "sft_rise_min", "sft_rise_steps", "sft_rise_minutes"),
        lambda s: (
            f"(avg_over_time(coda_trainer_sft_loss[{s.sft_rise_minutes}m]) > {s.sft_rise_factor:g} * "
            f"min_over_time(avg_over_time(coda_trainer_sft_loss[{s.sft_rise_minutes}m])[{_lb(s)}:1m])) "
            f"and (avg_over_time(coda_trainer_sft_loss[{s.sft_rise_minutes}m]) - "
            f"min_over_time(avg_over_time(coda_trainer_sft_loss[{s.sft_rise_minutes}m])[{_lb(s)}:1m]) "
            f"> {s.sft_rise_min:g})"
        ),
        checks.sft_loss_rising,
        prometheus_note="averaged over sft_rise_minutes, its lowest over lookback_hours",
    ),
    Rule(
        "ClipFractionHigh",
        "A large share of tokens is clipped: the updates move the policy too far per step.",
        "Lower the learning rate (`[trainer] lr`); check the mismatch KL (stale or mismatched samples are "
        "clipped too: `[shared] max_staleness`, `[inference] logprobs_mode`).",
        ("clip_fraction", "window_steps", "window_minutes"),
        lambda s: f"avg_over_time(coda_trainer_clip_fraction[{_w(s)}]) > {s.clip_fraction:g}",
        checks.clip_fraction_high,
    ),
    Rule(
        "NonFiniteLoss",
        "A step's loss or gradient norm is NaN or infinite.",
        "Stop and resume from the last good checkpoint with a lower learning rate (`[trainer] lr`); look for a reward or "
        "log-probability that is not finite (the trainer drops such samples and says so in its log).",
        (),
        lambda s: (
            "abs(coda_trainer_loss) == +Inf or coda_trainer_loss != coda_trainer_loss "
            "or abs(coda_trainer_grad_norm) == +Inf or coda_trainer_grad_norm != coda_trainer_grad_norm"
        ),
        checks.non_finite,
        severity="critical",
        prometheus_note="a NaN is left out of the trainer's gauges; an infinite value is seen",
    ),
)
