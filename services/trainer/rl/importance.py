"""Importance-sampling correction for the sampler ≠ trainer mismatch (vLLM bf16 vs trainer, or stale weights).

With μ the sampler's logprobs (recorded by the rollout per token) and π the trainer's proximal policy
(π_old when the trainer recomputes it — decoupled PPO), log w_t = clamp(log π_t − log μ_t, −20, 20):
    token (TIS):     w_t = min(e^{log w_t}, C)                           truncated at cap C
    sequence (MIS):  s_i = e^{mean_t log w_t} (geometric mean) or e^{Σ_t log w_t} (product);
                     the whole sequence gets weight 0 when s_i ∉ [C_min, C_max]
    token+sequence:  both (the peers' recommended default: seq-level masking is the safer filter)
Weights carry no gradient; multiply them into the per-token policy loss (``policy_loss(is_weights=...)``).
In bypass mode (the PPO ratio is taken against μ itself, no recompute pass) there is nothing to correct:
use mode ``none`` and read the mismatch metrics from ``mismatch_metrics``.

Metrics: ``is_weight_mean``; ``is_ess`` = (Σw)² / (n·Σw²) ∈ (0, 1] over trained tokens (1 = uniform weights);
``is_token_truncated_fraction``; ``is_seq_masked_fraction``; ``mismatch_kl_k1`` = mean(log μ − log π) and
``mismatch_kl_k3`` = mean(w − 1 − log w), both estimates of KL(μ ‖ π) from the sampler's own tokens.
"""

from __future__ import annotations

from typing import Literal

import torch

from services.trainer.rl.policy_loss import masked_mean
from services.trainer.rl.segments import broadcast_segments, segment_sums

ISMode = Literal["none", "token", "sequence", "token+sequence"]
SeqAgg = Literal["geo_mean", "product"]


def mismatch_metrics(logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """KL(μ ‖ π) estimates on trained tokens: k1 = mean(log μ − log π), k3 = mean(w − 1 − log w), w = π/μ."""
    with torch.no_grad():
        log_w = torch.clamp(logp.float() - sampler_logp.float(), -20.0, 20.0)
        return {
            "mismatch_kl_k1": float(masked_mean(-log_w, mask)),
            "mismatch_kl_k3": float(masked_mean(torch.exp(log_w) - 1.0 - log_w, mask)),
        }


def effective_sample_size(weights: torch.Tensor, mask: torch.Tensor) -> float:
    """Normalised ESS of the trained tokens' weights: (Σw)² / (n·Σw²); 1.0 when there is nothing to weigh."""
    w = weights[mask > 0].double()
    sq = float((w * w).sum())
    return float(w.sum() ** 2 / (w.numel() * sq)) if w.numel() and sq > 0 else 1.0


@torch.no_grad()
def importance_weights(
    logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: ISMode = "token+sequence",
    cap: float = 2.0,
    seq_min: float = 0.5,
    seq_max: float = 2.0,
    seq_agg: SeqAgg = "geo_mean",
    segment_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token IS weights (0 off the mask) and metrics; formulas in the module docstring."""
    m = mask > 0
    log_w = torch.clamp(logp.float() - sampler_logp.float(), -20.0, 20.0) * m
    raw = torch.exp(log_w)
    weights = torch.where(m, raw, torch.zeros_like(raw))
    truncated = torch.zeros_like(m)
    if mode in ("token", "token+sequence"):
        truncated = m & (raw > cap)
        weights = torch.where(m, torch.clamp(raw, max=cap), weights)
    seq_masked, num_seqs = 0, 0
    if mode in ("sequence", "token+sequence"):
        sums, counts = segment_sums(log_w, mask, segment_ids)
        seq_log = sums / counts.clamp(min=1) if seq_agg == "geo_mean" else sums
        seq_ratio = torch.exp(seq_log.clamp(-20.0, 20.0))
        keep = ((seq_ratio >= seq_min) & (seq_ratio <= seq_max)).to(weights.dtype)
        weights = weights * broadcast_segments(keep, mask, segment_ids)
        seq_masked, num_seqs = int((keep == 0).sum()), int(keep.numel())
    elif mode not in ("none", "token"):
        raise ValueError(f"unknown importance-sampling mode {mode!r}")
    if mode == "none":
        weights = m.to(weights.dtype)
    metrics = {
        "is_weight_mean": float(masked_mean(weights, mask)),
        "is_ess": effective_sample_size(weights, mask),
        "is_token_truncated_fraction": float(masked_mean(truncated.float(), mask)),
        "is_seq_masked_fraction": seq_masked / num_seqs if num_seqs else 0.0,
        **mismatch_metrics(logp, sampler_logp, mask),
    }
    return weights.to(logp.dtype), metrics
