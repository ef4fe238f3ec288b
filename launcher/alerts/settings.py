"""The alert thresholds: the recipe's ``[alerts]`` table, env prefix ``CODA_ALERTS_``.

Each threshold is read by the rules that name it in ``rules.RULES`` (``Rule.thresholds``); docs/alerts.md,
generated from those rules, lists them with their defaults.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from shared.settings import ServiceSettings, service_config


class AlertSettings(ServiceSettings):
    """When an RL-health alert fires (``make train`` and the generated Prometheus rules read the same values)."""

    model_config = service_config("CODA_ALERTS_")
    toml_section: ClassVar[str] = "alerts"

    enabled: bool = Field(True, description="Evaluate the alerts during `make train` (Prometheus always does)")
    window_steps: int = Field(10, ge=1, description="Steps that `make train`'s windowed rules average over")
    window_minutes: int = Field(15, ge=1, description="Minutes that Prometheus's windowed rules average over")
    lookback_hours: int = Field(6, ge=1, description="Hours over which Prometheus takes peaks and medians")
    stall_factor: float = Field(5.0, gt=1, description="Trainer not stepping: no step for this many median steps")
    stall_min_s: float = Field(300.0, gt=0, description="Trainer not stepping: and for at least this many seconds")
    rollout_stall_s: float = Field(
        600.0, gt=0, description="Rollout not producing: no group published for this many seconds (queue empty)"
    )
    server_down_s: float = Field(60.0, gt=0, description="Policy server down: unanswering for this many seconds")
    server_lag_versions: int = Field(
        2, ge=1, description="Policy server behind: serving a version at least this many behind the live one"
    )
    server_behind_s: float = Field(120.0, gt=0, description="Policy server behind: for this many seconds")
    stale_share: float = Field(
        0.25, gt=0, le=1, description="Stale rollouts: share of sampled episodes dropped for staleness above this"
    )
    mismatch_kl: float = Field(0.2, gt=0, description="Sampler mismatch: mismatch KL (k3), windowed mean, above this")
    mismatch_spike_factor: float = Field(
        10.0, gt=1, description="Sampler mismatch: and above this many times its median (a stale sampler's KL)"
    )
    is_weight_deviation: float = Field(
        0.2, gt=0, description="Sampler mismatch: mean importance weight further than this from 1"
    )
    entropy_fraction: float = Field(
        0.1, gt=0, lt=1, description="Entropy collapse: entropy below this fraction of its peak (its early value)"
    )
    entropy_floor: float = Field(0.1, gt=0, description="Entropy collapse: and below this many nats per token")
    entropy_solved_reward: float = Field(
        0.9,
        description="Entropy collapse: not while the smoothed reward is at least this (a policy that solved its "
        "task has no reason to explore)",
    )
    entropy_learned_gain: float = Field(
        0.3,
        ge=0,
        description="Entropy collapse: nor while the smoothed reward is at least this much above where RL started "
        "(a policy that became sure while its reward climbed learned; one whose reward stayed where it was collapsed). "
        "With demonstrations in the loss (RED) the entropy of a learned format falls to a few percent of its peak",
    )
    reward_drop_fraction: float = Field(
        0.5, gt=0, le=1, description="Reward drop: smoothed reward lost more than this fraction of its range"
    )
    reward_drop_min: float = Field(0.1, ge=0, description="Reward drop: and more than this much below its peak")
    reward_drop_z: float = Field(
        3.0,
        ge=0,
        description="Reward drop: and more than this many standard errors of the difference of two window means "
        "(from the spread of every step's reward): a plateau's noisy windows do not count as a drop",
    )
    no_signal_share: float = Field(
        0.9,
        gt=0,
        le=1,
        description="No learning signal: share of groups without a signal above this (`signal_share` below 1 − this)",
    )
    no_signal_steps: int = Field(
        5,
        ge=1,
        description="No learning signal: over the last this many RL steps (a short run has tens; a policy trained "
        "from scratch, rewarded only after tens of steps, needs more: tiny-cpu sets 60)",
    )
    no_signal_minutes: int = Field(
        4, ge=1, description="No learning signal: the Prometheus window (minutes, where make train counts steps)"
    )
    no_signal_solved_reward: float = Field(
        0.5,
        description="No learning signal: not while the mean reward over those steps is at least this (equal "
        "rewards of a solved task: its groups are mostly all 1)",
    )
    sft_rise_factor: float = Field(
        1.25,
        gt=1,
        description="Demonstration loss rising: the SFT loss (mean of sft_rise_steps) above this many times its "
        "lowest such mean",
    )
    sft_rise_min: float = Field(
        1.0, gt=0, description="Demonstration loss rising: and more than this many nats per token above it"
    )
    sft_rise_steps: int = Field(3, ge=1, description="Demonstration loss rising: steps that make train averages over")
    sft_rise_minutes: int = Field(
        2, ge=1, description="Demonstration loss rising: minutes that Prometheus averages over"
    )
    clip_fraction: float = Field(0.2, gt=0, le=1, description="Clip fraction high: windowed mean above this")
