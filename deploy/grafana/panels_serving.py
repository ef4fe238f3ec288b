"""The retrieval and inference dashboards' panels (what dashboards.py writes)."""

from __future__ import annotations

from deploy.grafana.grafana_model import RATE, Dashboard, Panel, mean_of, quantile

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
