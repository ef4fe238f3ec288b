"""Inference-server settings (``[inference]`` in a recipe, ``CODA_INFERENCE_*`` in the environment, ``--flags``).

Names follow vLLM's flags where one exists (``served_model_name``, ``max_model_len``, ``max_num_seqs``,
``max_loras``, ``max_lora_rank``, ``logprobs_mode``), so a recipe reads the same for both servers.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from shared.precision import Precision
from shared.server_registry import DEFAULT_PREFIX
from shared.settings import ServiceSettings, service_config


class InferenceSettings(ServiceSettings):
    """How ``python -m services.inference serve`` loads the policy and answers the vLLM-shaped API."""

    model_config = service_config("CODA_INFERENCE_")
    toml_section: ClassVar[str] = "inference"
    shared_keys: ClassVar[dict[str, str]] = {
        "model": "model",
        "served_model_name": "served_model_name",
        "redis_url": "redis_url",
    }

    model: str = Field("runs/tiny-model", description="HF model directory (e.g. written by `make-tiny`)")
    served_model_name: str | None = Field(None, description="Name requests use in `model`; default: the path")
    host: str = Field("127.0.0.1", description="Interface to bind")
    port: int = Field(8002, ge=1, le=65535, description="HTTP port")
    max_model_len: int | None = Field(None, ge=2, description="Context length; default: the model config's")
    max_num_seqs: int = Field(128, ge=1, description="Most sequences decoded together in one forward pass")
    max_prefill_batch: int = Field(16, ge=1, description="New prompts run together in one prefill pass")
    max_tokens_default: int = Field(16, ge=1, description="max_tokens when a request sends none (vLLM: 16)")
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] = Field(
        "raw_logprobs", description="Logprobs of the raw model (vLLM default) or of the sampled distribution"
    )
    max_loras: int = Field(4, ge=1, description="LoRA adapters resident at once (load beyond this → 400)")
    max_lora_rank: int = Field(64, ge=1, description="Largest LoRA rank accepted")
    merge_adapter: bool = Field(
        False,
        description="Off by default: in on-policy RL on SmolLM2 + LoRA r16 (bench/results/merge_adapter.md) its "
        "gain was within the noise (samples/s 0.92x and 1.21x in two rounds) and each policy version pays a merge "
        "(~1.2 s). "
        "While every row of a decode step names the same LoRA adapter (RL: the newest policy-vN), "
        "fold it into the base weights (W += scale·B·A) so the step costs what the base model costs instead of "
        "peft's per-row LoRA path in every wrapped linear; a step with base or other-adapter rows, and any weight "
        "change, unmerges first. Only where the forward computes in fp32 (in bf16 the merged weight would round "
        "the delta, unlike the trainer's unmerged LoRA). Merged rows match the per-row path to fp32 rounding; "
        "merge then unmerge is not bit-exact in fp32, so the merge keeps the original value of the few weight "
        "elements that would come back an ulp off (8 bytes each, at most 1/32 of a weight's) and base rows stay "
        "exact. false = always the per-row path",
    )
    weights_root: str = Field("runs", description="Adapter and reload paths must lie under this directory")
    prefix_cache_mb: float = Field(
        512,
        ge=0,
        description="MiB of KV of finished/prefilled sequences kept for reuse by prompts that extend them "
        "(multi-turn, GRPO samples); 0 = off. SmolLM2-135M's KV is 23 kB a token in bf16, 46 kB in fp32 "
        "(kv_dtype), so 512 MiB holds ~23k / ~11.6k tokens",
    )
    prefix_cache_tokens: int | None = Field(
        None,
        ge=0,
        description="Also bound the prefix cache in tokens (the bound before prefix_cache_mb existed; both "
        "apply when set); 0 = off; none: bytes only",
    )
    kv_dtype: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="dtype of the KV cache and of the prefix cache: auto = the compute dtype (bf16 under bf16 "
        "autocast, where the attention casts K and V to bf16 anyway, so bf16 storage changes no output and "
        "halves the bytes). bf16 with fp32 compute saves memory but rounds K and V (cast back on each read)",
    )
    precision: Precision = Field(
        "auto",
        description="Matmul precision of the forward passes: fp32 weights, bf16 autocast when bf16 (the "
        "logits stay fp32). auto: bf16 on a CPU that multiplies it natively (AVX512-BF16/AMX), else fp32 — the "
        "trainer's rule, so both compute alike",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where the model runs: auto = the first CUDA GPU when torch sees one, else the CPU",
    )
    threads: int = Field(
        1,
        ge=0,
        description="torch CPU threads; 1 is fastest for tiny models and on shared "
        "machines (more threads spin against each other); 0 = torch's default",
    )
    pause_wait_s: float = Field(
        60.0,
        ge=0,
        description="How long a completion arriving while /pause holds "
        "admission waits for /resume before a 503 (a weight sync takes seconds)",
    )
    seed: int = Field(0, description="Seed of the sampler for requests without their own seed")
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="Largest request body (else 413)")
    log_format: Literal["kv", "json"] = Field("kv", description="Log line format")

    # ------------------------------------------------------------ joining a fleet (off unless both are set)
    redis_url: str | None = Field(
        None,
        description="Redis where this server announces itself to the rollout (with advertise_url; none: it "
        "does not announce, and only rollouts whose settings list it use it)",
    )
    advertise_url: str | None = Field(
        None,
        description="Base URL the rollout reaches this server at, e.g. http://gpu-2:8002; '{hostname}' is "
        "replaced by this host's name, so replicas of one compose service can share the setting "
        "(none: do not announce)",
    )
    servers_key: str = Field(
        DEFAULT_PREFIX, description="Redis key prefix of the announcements (the rollout's servers_key)"
    )
    announce_every_s: float = Field(
        5.0, gt=0, description="Heartbeat period of the announcement; it expires after three missed beats"
    )
