"""The training and pipeline dashboards' panels (what dashboards.py writes)."""

from __future__ import annotations

from deploy.grafana.grafana_model import RATE, Dashboard, Panel, mean_of, quantile

TRAINING = Dashboard(
    "coda-training",
    "coda-stack / training",
    "What the policy learns: rewards, answer quality, losses, RED, optimisation health.",
    [
        (
            # The RL-health alerts (deploy/prometheus/alerts.yml, docs/alerts.md), from Prometheus's ALERTS series.
            "Alerts",
            [
                Panel(
                    "RL-health alerts firing",
                    [('count(ALERTS{kind="rl-health", alertstate="firing"}) or vector(0)', "firing")],
                    kind="stat",
                    description="Alerts of deploy/prometheus/alerts.yml firing now; docs/alerts.md says what to do.",
                    width=6,
                ),
                Panel(
                    "Alert states (1 while firing, 0.5 while pending)",
                    [
                        ('max by (alertname) (ALERTS{kind="rl-health", alertstate="firing"})', "{{alertname}}"),
                        (
                            '0.5 * max by (alertname) (ALERTS{kind="rl-health", alertstate="pending"})',
                            "{{alertname}} (pending)",
                        ),
                    ],
                    description="Each RL-health alert over time: a run that stopped learning shows here first.",
                    width=18,
                ),
            ],
        ),
        (
            "Progress",
            [
                Panel("Optimizer step", [("max(coda_trainer_step)", "step")], kind="stat", width=6),
                Panel("Policy version", [("max by (job) (coda_policy_version)", "{{job}}")], kind="stat", width=6),
                Panel("Mean reward (trainer batch)", [("coda_trainer_reward_mean", "reward")], kind="stat", width=6),
                Panel(
                    "Answer F1 (last group)",
                    [('coda_rollout_reward_component{component="answer_f1"}', "F1")],
                    kind="stat",
                    unit="percentunit",
                    width=6,
                ),
            ],
        ),
        (
            "Rewards",
            [
                Panel(
                    "Reward components (mean of the last group)",
                    [("coda_rollout_reward_component", "{{component}}")],
                    description="Every named component the recipe's reward reports, per rollout group.",
                ),
                Panel(
                    "Answer F1 / EM",
                    [('coda_rollout_reward_component{component=~"answer_f1|answer_em"}', "{{component}}")],
                    unit="percentunit",
                ),
                Panel(
                    "Reward distribution (p10 / p50 / p90)",
                    [(quantile(q, "coda_rollout_reward"), f"p{int(q * 100)}") for q in (0.1, 0.5, 0.9)],
                ),
                Panel(
                    "Mean reward per step",
                    [
                        ("coda_trainer_reward_mean", "trainer batch"),
                        (mean_of("coda_rollout_reward"), "rollout episodes"),
                    ],
                ),
            ],
        ),
        (
            "Losses and RED",
            [
                Panel(
                    "Losses",
                    [
                        ("coda_trainer_loss", "total"),
                        ("coda_trainer_pg_loss", "policy gradient"),
                        ("coda_trainer_sft_loss", "SFT (RED)"),
                    ],
                ),
                Panel(
                    "RED weights",
                    [
                        ("coda_trainer_red_final_weight", "final weight"),
                        ("coda_trainer_red_entropy_weight", "entropy-change ratio"),
                        ("coda_trainer_red_accuracy_factor", "accuracy factor"),
                        ("coda_trainer_red_sft_loss_weight", "SFT loss weight"),
                    ],
                ),
                Panel(
                    "KL",
                    [
                        ("coda_trainer_kl", "KL to the reference"),
                        ("coda_trainer_mismatch_kl_k3", "sampler vs trainer (k3)"),
                    ],
                ),
                Panel("Clip fraction", [("coda_trainer_clip_fraction", "clipped tokens")], unit="percentunit"),
                Panel(
                    "Groups with a learning signal",
                    [("coda_trainer_signal_share", "share of groups (rewards not all equal)")],
                    unit="percentunit",
                ),
                Panel("Entropy", [("coda_trainer_rl_entropy", "policy entropy (RL tokens)")]),
                Panel(
                    "Importance weights",
                    [
                        ("coda_trainer_is_weight_mean", "mean IS weight"),
                        ("coda_trainer_is_ess", "effective sample size"),
                        ("coda_trainer_is_seq_masked_fraction", "masked sequences"),
                    ],
                ),
            ],
        ),
        (
            "Optimisation",
            [
                Panel("Step time", [("coda_trainer_step_seconds", "step")], unit="s"),
                Panel("Training tokens/s", [("coda_trainer_tokens_per_second", "tokens/s")]),
                Panel("Gradient norm", [("coda_trainer_grad_norm", "grad norm")]),
                Panel("Learning rate", [("coda_trainer_lr", "lr")]),
            ],
        ),
    ],
)

PIPELINE = Dashboard(
    "coda-pipeline",
    "coda-stack / pipeline",
    "How groups flow from rollout through Redis to the trainer, and weights back.",
    [
        (
            "Throughput",
            [
                Panel("Episodes/s", [(f"sum by (recipe) (rate(coda_rollout_episodes_total[{RATE}]))", "{{recipe}}")]),
                Panel(
                    "Groups/s by outcome",
                    [(f"sum by (outcome) (rate(coda_rollout_groups_total[{RATE}]))", "{{outcome}}")],
                ),
                Panel(
                    "Episode time (p50 / p99)",
                    [
                        (quantile(0.5, "coda_rollout_episode_seconds"), "p50"),
                        (quantile(0.99, "coda_rollout_episode_seconds"), "p99"),
                    ],
                    unit="s",
                ),
                Panel("Turns per episode (mean)", [(mean_of("coda_rollout_turns_per_episode"), "turns")]),
                Panel("Tokens/s published", [(f"sum by (kind) (rate(coda_rollout_tokens_total[{RATE}]))", "{{kind}}")]),
                Panel(
                    "Groups in flight / prompts queued",
                    [
                        ("coda_rollout_running_groups", "running groups"),
                        ("coda_rollout_queued_prompts", "queued prompts"),
                    ],
                ),
            ],
        ),
        (
            "Queue and staleness",
            [
                Panel(
                    "Trajectory queue",
                    [
                        ("coda_trainer_queue_lag", "lag (groups not yet delivered)"),
                        ("coda_trainer_queue_pending", "pending (delivered, not acked)"),
                    ],
                ),
                Panel(
                    "Staleness at publish (p50 / p99)",
                    [
                        (quantile(0.5, "coda_rollout_staleness_versions"), "p50"),
                        (quantile(0.99, "coda_rollout_staleness_versions"), "p99"),
                    ],
                    description="Live policy version minus the oldest version that produced a group's tokens.",
                ),
                Panel(
                    "Staleness seen by the trainer",
                    [
                        ("coda_trainer_staleness_mean", "mean"),
                        ("coda_trainer_staleness_max", "max"),
                        ("coda_trainer_dropped_stale", "dropped (total)"),
                    ],
                ),
                Panel(
                    "Admission wait (p50 / p99)",
                    [
                        (quantile(0.5, "coda_rollout_admission_wait_seconds"), "p50"),
                        (quantile(0.99, "coda_rollout_admission_wait_seconds"), "p99"),
                    ],
                    unit="s",
                    description="Time a new group waits for the staleness budget to admit it.",
                ),
                Panel(
                    "Steps without RL tokens",
                    [
                        (
                            f"sum by (trained) (increase(coda_trainer_steps_without_rl_total[{RATE}]))",
                            "{{trained}} instead",
                        )
                    ],
                    description="Steps whose RL samples were all stale or untrained (sft: demonstrations only; "
                    "nothing: no step was taken). Anything but a short burst after a restart is a fault.",
                ),
            ],
        ),
        (
            "Weights and failures",
            [
                Panel(
                    "Policy version",
                    [
                        ("max by (job) (coda_policy_version)", "{{job}}"),
                        ("coda_inference_weight_version", "served (CPU server)"),
                    ],
                ),
                Panel(
                    "Weight sync latency",
                    [
                        ("coda_trainer_publish_seconds", "last publish"),
                        (quantile(0.99, "coda_trainer_publish_seconds_hist"), "p99 publish"),
                        (quantile(0.99, "coda_inference_weight_update_seconds", "kind"), "p99 apply ({{kind}})"),
                    ],
                    unit="s",
                ),
                Panel(
                    "Trainer vs server logprobs after a publish (max |diff|)",
                    [("coda_trainer_sync_max_abs_diff", "max abs diff")],
                    description="With [trainer.sync] check on: the served weights score a fixed prompt as the trainer does.",
                ),
                Panel(
                    "Failures by cause", [(f"sum by (cause) (rate(coda_rollout_failures_total[{RATE}]))", "{{cause}}")]
                ),
                Panel(
                    "HTTP errors by service",
                    [
                        (
                            f'sum by (service, status) (rate(coda_http_requests_total{{status=~"4..|5.."}}[{RATE}]))',
                            "{{service}} {{status}}",
                        )
                    ],
                ),
                Panel("Services up", [("up", "{{job}}")], kind="stat", width=24),
            ],
        ),
    ],
)
