"""Writes the Grafana dashboards (deploy/grafana/dashboards/*.json) from the panel tables below.

    python deploy/grafana/dashboards.py          # regenerate after editing a table

The JSON files are committed (Grafana provisions them from disk); a test fails when they differ from what
this script writes, and another checks that every metric a panel queries is exported by some service
(``coda_*``) or is one of vLLM's own (``deploy/prometheus/vllm-metrics.txt``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}  # provisioning/datasources/prometheus.yml
RATE = "$__rate_interval"


@dataclass
class Panel:
    title: str
    targets: list[tuple[str, str]]  # (PromQL, legend)
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat
    description: str = ""
    width: int = 12


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    rows: list[tuple[str, list[Panel]]] = field(default_factory=list)


def quantile(q: float, metric: str, by: str = "", where: str = "") -> str:
    labels = f"{{{where}}}" if where else ""
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{labels}[{RATE}])))"


def mean_of(metric: str, by: str = "", where: str = "") -> str:
    labels = f"{{{where}}}" if where else ""
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({metric}_sum{labels}[{RATE}])) / sum{group} (rate({metric}_count{labels}[{RATE}]))"


TRAINING = Dashboard(
    "coda-training",
    "coda-stack / training",
    "What the policy learns: rewards, answer quality, losses, RED, optimisation health.",
    [
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
                        ("coda_trainer_red_weight", "final weight"),
                        ("coda_trainer_red_entropy_weight", "entropy-change ratio"),
                        ("coda_trainer_red_accuracy_factor", "accuracy factor"),
                        ("coda_trainer_red_sft_weight", "SFT loss weight"),
                    ],
                ),
                Panel(
                    "KL",
                    [
                        ("coda_trainer_kl", "KL to the reference"),
                        ("coda_trainer_mismatch_kl", "sampler vs trainer (k3)"),
                    ],
                ),
                Panel("Clip fraction", [("coda_trainer_clip_fraction", "clipped tokens")], unit="percentunit"),
                Panel("Entropy", [("coda_trainer_entropy", "policy entropy (RL tokens)")]),
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
                        ("coda_trainer_dropped_stale_total", "dropped (total)"),
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
                        ("coda_trainer_weight_sync_seconds", "last publish"),
                        (quantile(0.99, "coda_trainer_weight_sync_seconds_hist"), "p99 publish"),
                        (quantile(0.99, "coda_inference_weight_update_seconds", "kind"), "p99 apply ({{kind}})"),
                    ],
                    unit="s",
                ),
                Panel(
                    "Trainer vs server logprobs after a publish (max |diff|)",
                    [("coda_trainer_sync_max_abs_diff", "max abs diff")],
                    description="With sync_check on: the served weights score a fixed prompt as the trainer does.",
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

RETRIEVAL = Dashboard(
    "coda-retrieval",
    "coda-stack / retrieval",
    "The retriever: query rate, latency, micro-batching.",
    [
        (
            "Load",
            [
                Panel(
                    "Queries/s by mode", [(f"sum by (mode) (rate(coda_retriever_queries_total[{RATE}]))", "{{mode}}")]
                ),
                Panel(
                    "Requests/s",
                    [(f'sum by (route) (rate(coda_http_requests_total{{service="retriever"}}[{RATE}]))', "{{route}}")],
                ),
                Panel("Documents in the index", [("coda_retriever_documents", "documents")], kind="stat", width=24),
            ],
        ),
        (
            "Latency",
            [
                Panel(
                    "/retrieve latency (p50 / p99)",
                    [
                        (
                            quantile(q, "coda_http_request_seconds", where='service="retriever", route="/retrieve"'),
                            f"p{int(q * 100)}",
                        )
                        for q in (0.5, 0.99)
                    ],
                    unit="s",
                ),
                Panel(
                    "Batch stage time (p50)",
                    [(quantile(0.5, "coda_retriever_stage_seconds", "stage"), "{{stage}}")],
                    unit="s",
                ),
            ],
        ),
        (
            "Batching",
            [
                Panel(
                    "Queries per batch (mean / p99)",
                    [
                        (mean_of("coda_retriever_batch_queries"), "mean"),
                        (quantile(0.99, "coda_retriever_batch_queries"), "p99"),
                    ],
                ),
                Panel("Requests merged per batch (mean)", [(mean_of("coda_retriever_batch_requests"), "mean")]),
            ],
        ),
        (
            "Searcher (the frozen search agent)",
            [
                Panel(
                    "Searches/s by outcome",
                    [(f"sum by (outcome) (rate(coda_searcher_requests_total[{RATE}]))", "{{outcome}}")],
                    width=8,
                ),
                Panel(
                    "Retriever calls per search (mean)",
                    [(mean_of("coda_searcher_searches_per_request"), "mean")],
                    width=8,
                ),
                Panel(
                    "Search episode time (p50 / p99)",
                    [
                        (quantile(0.5, "coda_searcher_request_seconds"), "p50"),
                        (quantile(0.99, "coda_searcher_request_seconds"), "p99"),
                    ],
                    unit="s",
                    width=8,
                ),
            ],
        ),
    ],
)

INFERENCE = Dashboard(
    "coda-inference",
    "coda-stack / inference",
    "The policy server: vLLM (gpu profile) or the CPU server (cpu profile).",
    [
        (
            "Throughput",
            [
                Panel(
                    "Generated tokens/s",
                    [
                        (f"sum(rate(vllm:generation_tokens_total[{RATE}]))", "vLLM"),
                        (f"sum(rate(coda_inference_generation_tokens_total[{RATE}]))", "CPU server"),
                    ],
                ),
                Panel(
                    "Prompt tokens/s",
                    [
                        (f"sum(rate(vllm:prompt_tokens_total[{RATE}]))", "vLLM"),
                        (f"sum(rate(coda_inference_prompt_tokens_total[{RATE}]))", "CPU server"),
                    ],
                ),
            ],
        ),
        (
            "Batch",
            [
                Panel(
                    "Running / waiting requests",
                    [
                        ("sum(vllm:num_requests_running)", "vLLM running"),
                        ("sum(vllm:num_requests_waiting)", "vLLM waiting"),
                        ("coda_inference_running_sequences", "CPU running"),
                        ("coda_inference_waiting_requests", "CPU waiting"),
                    ],
                ),
                Panel(
                    "Batch size per decoding step (mean)",
                    [
                        (mean_of("vllm:iteration_tokens_total"), "vLLM tokens/step"),
                        (mean_of("coda_inference_batch_size"), "CPU sequences/step"),
                    ],
                ),
                Panel("KV-cache usage (vLLM)", [("vllm:kv_cache_usage_perc", "{{model_name}}")], unit="percentunit"),
                Panel(
                    "Request latency (p50 / p99, vLLM)",
                    [
                        (quantile(0.5, "vllm:e2e_request_latency_seconds"), "e2e p50"),
                        (quantile(0.99, "vllm:e2e_request_latency_seconds"), "e2e p99"),
                        (quantile(0.99, "vllm:time_to_first_token_seconds"), "first token p99"),
                    ],
                    unit="s",
                ),
            ],
        ),
        (
            "Version",
            [
                Panel(
                    "Weight version",
                    [
                        ("coda_inference_weight_version", "served (CPU server)"),
                        ("max by (job) (coda_policy_version)", "{{job}}"),
                    ],
                ),
                Panel("LoRA adapters resident (CPU server)", [("coda_inference_loaded_adapters", "adapters")]),
                Panel(
                    "Weight updates",
                    [(f"sum by (kind) (increase(coda_inference_weight_updates_total[{RATE}]))", "{{kind}}")],
                ),
                Panel(
                    "Decode tokens/s (CPU server, moving average)", [("coda_inference_tokens_per_second", "tokens/s")]
                ),
                Panel(
                    "Decoding step time (CPU server, p50 / p99)",
                    [
                        (quantile(0.5, "coda_inference_step_seconds"), "p50"),
                        (quantile(0.99, "coda_inference_step_seconds"), "p99"),
                    ],
                    unit="s",
                ),
                Panel(
                    "Prompt tokens from the prefix cache (CPU server)",
                    [
                        (
                            f"sum(rate(coda_inference_prefix_cache_hit_tokens_total[{RATE}])) / "
                            f"sum(rate(coda_inference_prompt_tokens_total[{RATE}]))",
                            "hit fraction",
                        )
                    ],
                    unit="percentunit",
                ),
            ],
        ),
    ],
)

DASHBOARDS = {"training": TRAINING, "pipeline": PIPELINE, "retrieval": RETRIEVAL, "inference": INFERENCE}


def _panel_json(panel: Panel, pid: int, x: int, y: int) -> dict:
    targets = [
        {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
        for i, (expr, legend) in enumerate(panel.targets)
    ]
    out = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "datasource": DATASOURCE,
        "gridPos": {"h": 4 if panel.kind == "stat" else 8, "w": panel.width, "x": x, "y": y},
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
    }
    if panel.description:
        out["description"] = panel.description
    if panel.kind == "timeseries":
        out["options"] = {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}
    else:
        out["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
        }
    return out


def render(dashboard: Dashboard) -> dict:
    """The Grafana dashboard JSON (schema of Grafana 10/11) of one dashboard table."""
    panels, pid, y = [], 1, 0
    for row_title, row_panels in dashboard.rows:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y, x, row_height = pid + 1, y + 1, 0, 0
        for panel in row_panels:
            if x + panel.width > 24:
                x, y, row_height = 0, y + row_height, 0
            item = _panel_json(panel, pid, x, y)
            panels.append(item)
            pid, x, row_height = pid + 1, x + panel.width, max(row_height, item["gridPos"]["h"])
        y += row_height
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["coda-stack"],
        "timezone": "browser",
        "editable": False,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": []},
        "annotations": {"list": []},
        "links": [],
        "panels": panels,
    }


def dump(dashboard: Dashboard) -> str:
    return json.dumps(render(dashboard), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, dashboard in DASHBOARDS.items():
        (OUT / f"{name}.json").write_text(dump(dashboard))
        print(f"wrote {OUT / f'{name}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
