"""Prometheus metrics of the inference server (``coda_inference_*``), fed by the engine thread."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.metrics import LATENCY_BUCKETS

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class InferenceMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("coda_inference_requests_total", "Completion requests finished", registry=registry)
        self.prompt_tokens = Counter("coda_inference_prompt_tokens_total", "Prompt tokens processed", registry=registry)
        self.generation_tokens = Counter(
            "coda_inference_generation_tokens_total", "Tokens generated", registry=registry
        )
        self.batch_size = Histogram(
            "coda_inference_batch_size", "Sequences per decoding step", buckets=BATCH_BUCKETS, registry=registry
        )
        self.step_seconds = Histogram(
            "coda_inference_step_seconds", "Duration of one decoding step", buckets=LATENCY_BUCKETS, registry=registry
        )
        self.tokens_per_second = Gauge(
            "coda_inference_tokens_per_second",
            "Decode throughput, exponential moving average over steps",
            registry=registry,
        )
        self.running = Gauge("coda_inference_running_sequences", "Sequences being decoded", registry=registry)
        self.waiting = Gauge("coda_inference_waiting_requests", "Requests waiting for admission", registry=registry)
        self.adapters = Gauge("coda_inference_loaded_adapters", "LoRA adapters resident", registry=registry)
        self.weight_version = Gauge(
            "coda_inference_weight_version", "Version of the base weights served", registry=registry
        )
        self.reloads = Counter(
            "coda_inference_weight_updates_total", "Weight updates applied", ["kind"], registry=registry
        )
        self.reload_seconds = Histogram(
            "coda_inference_weight_update_seconds",
            "Time from update request to new weights live",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.adapter_merges = Counter(
            "coda_inference_adapter_merges_total",
            "LoRA adapter merges into and unmerges out of the base weights",
            ["op"],
            registry=registry,
        )
        self.prefix_hit_tokens = Counter(
            "coda_inference_prefix_cache_hit_tokens_total",
            "Prompt tokens whose KV came from the prefix cache",
            registry=registry,
        )
        self.prefix_hits = Counter(
            "coda_inference_prefix_cache_hits_total", "Prompts whose prefill reused cached KV", registry=registry
        )
        self.prefix_cache_bytes = Gauge(
            "coda_inference_prefix_cache_bytes", "Bytes of KV held by the prefix cache", registry=registry
        )
        self.prefill_tokens = Counter(
            "coda_inference_prefill_tokens_total",
            "Prompt tokens run through the model by prefill passes (prefix-cache hits excluded)",
            registry=registry,
        )
        self.prefill_seconds = Histogram(
            "coda_inference_prefill_seconds",
            "Duration of one (batched) prefill pass",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._tps = 0.0

    # EngineMetrics protocol (called from the engine thread)
    def on_step(self, rows: int, seconds: float, new_tokens: int) -> None:
        self.batch_size.observe(rows)
        self.step_seconds.observe(seconds)
        if seconds > 0:
            rate = new_tokens / seconds
            self._tps = rate if self._tps == 0 else 0.9 * self._tps + 0.1 * rate
            self.tokens_per_second.set(self._tps)

    def on_request_done(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.requests.inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)

    def on_prefix_hit(self, tokens: int) -> None:
        self.prefix_hits.inc()
        self.prefix_hit_tokens.inc(tokens)

    def on_prefill(self, tokens: int, seconds: float) -> None:
        self.prefill_tokens.inc(tokens)
        self.prefill_seconds.observe(seconds)
