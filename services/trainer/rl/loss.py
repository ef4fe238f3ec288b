"""The RL loss, in one place: the PPO clipped surrogate (symmetric, clip-higher, dual-clip), the KL term to a
reference model, the importance-sampling correction, and ``rl_loss`` that combines them for one micro-batch,
all with a loss aggregation that does not depend on how the optimizer batch is split into micro-batches.

Token loss, with r = exp(clamp(logπ_θ − logπ_old, −20, 20)) and advantage A:
    ℓ = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))          (ε_low = ε_high: symmetric; ε_high > ε_low: DAPO)
    dual-clip (c > 1), for A < 0 only: ℓ ← min(ℓ, −c·A)          (bounds the loss of a huge ratio on a bad sample)

Aggregation over the WHOLE optimizer batch (m = trained-token mask, N = the global normaliser):
    token-mean: L = Σ_{i,t} m·ℓ / N,  N = trained tokens in the optimizer batch          (DAPO / TRL "dapo")
    seq-mean:   L = Σ_i (Σ_t m·ℓ / Σ_t m) / N,  N = sequences with a trained token     (original GRPO)
    dr-grpo:    L = Σ_{i,t} m·ℓ / N,  N = sequences · L_max, L_max a constant        (Dr. GRPO)
Each micro-batch's loss uses the same global N (``loss_normaliser``), so summing the micro-batch losses (and
their gradients) gives exactly the full-batch loss: no ``/ gradient_accumulation`` fix-up, and dynamic
micro-batch sizes cannot rescale the gradient (as they did in upstream CoDA; ``docs/upstream.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from services.trainer.config import ImportanceSampling
from services.trainer.rl.segments import broadcast_segments, segment_sums

AggMode = Literal["token-mean", "seq-mean", "dr-grpo"]


def loss_normaliser(mode: AggMode, num_tokens: int, num_sequences: int, max_len: int | None = None) -> float:
    """The global N for ``aggregate``: computed once per optimizer batch, passed to every micro-batch.

    ``num_tokens``: trained tokens (sum of loss masks) in the optimizer batch; ``num_sequences``: sequences
    with at least one trained token; ``max_len``: Dr. GRPO's constant (e.g. the max response length).
    Returns at least 1 so an empty batch gives a zero loss, not a NaN.
    """
    if mode == "token-mean":
        n = num_tokens
    elif mode == "seq-mean":
        n = num_sequences
    elif mode == "dr-grpo":
        if not max_len:
            raise ValueError("dr-grpo aggregation needs max_len (the constant L_max)")
        n = num_sequences * max_len
    else:
        raise ValueError(f"unknown aggregation {mode!r}")
    return float(max(n, 1))


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: AggMode, normaliser: float, segment_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Reduce per-token ``values`` to this micro-batch's share of the batch loss (formulas in the module doc)."""
    m = mask.to(values.dtype)
    if mode in ("token-mean", "dr-grpo"):
        return (values * m).sum() / normaliser
    if mode == "seq-mean":
        sums, counts = segment_sums(values, mask, segment_ids)
        return (sums / counts.clamp(min=1)).sum() / normaliser
    raise ValueError(f"unknown aggregation {mode!r}")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``Σ m·v / max(Σ m, 1)``: a local mean over trained tokens (for metrics)."""
    m = mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp(min=1)


@dataclass(frozen=True)
class ClipConfig:
    """PPO clip settings: ``clip_low`` = ε_low, ``clip_high`` = ε_high, ``dual_clip`` = c (> 1) or None."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None

    def __post_init__(self) -> None:
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {self.dual_clip}")


def ppo_token_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, cfg: ClipConfig = ClipConfig()
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped surrogate ℓ (module docstring) and boolean per-token masks of which clip was active.

    ``advantages`` is per token ``(rows, tokens)`` or per row ``(rows,)`` (broadcast over the row).
    Masks: ``clipped`` (the clipped branch won and its gradient is 0), ``clipped_low``, ``clipped_high``,
    ``dual_clipped``; plus ``ratio``.
    """
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    adv = adv.to(logp.dtype)
    ratio = torch.exp(torch.clamp(logp - old_logp, -20.0, 20.0))
    unclipped = -adv * ratio
    clipped_term = -adv * torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss = torch.maximum(unclipped, clipped_term)
    with torch.no_grad():
        high = (adv > 0) & (ratio > 1.0 + cfg.clip_high)
        low = (adv < 0) & (ratio < 1.0 - cfg.clip_low)
        dual = torch.zeros_like(high)
    if cfg.dual_clip is not None:
        cap = -adv * cfg.dual_clip
        with torch.no_grad():
            dual = (adv < 0) & (loss > cap)
        loss = torch.where(adv < 0, torch.minimum(loss, cap), loss)
    info = {
        "ratio": ratio.detach(),
        "clipped": high | low | dual,
        "clipped_low": low,
        "clipped_high": high,
        "dual_clipped": dual,
    }
    return loss, info


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    normaliser: float,
    mode: AggMode = "token-mean",
    cfg: ClipConfig = ClipConfig(),
    segment_ids: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Aggregated PPO loss of one micro-batch and its metrics.

    ``is_weights`` (no gradient; see ``importance.importance_weights``) multiplies ℓ per token before
    aggregation: the decoupled-PPO correction for the sampler ≠ π_old mismatch. Metrics are local masked
    means over this micro-batch (``num_tokens`` tells the caller how to weight them when averaging):
    ``pg_loss``, ``clip_fraction``, ``clip_low_fraction``, ``clip_high_fraction``, ``dual_clip_fraction``,
    ``ratio_mean``, ``approx_kl`` (k3 of π_old→π_θ, ≥ 0), ``ppo_kl`` (k1: mean(logπ_old − logπ_θ)).
    """
    token_loss, info = ppo_token_loss(logp, old_logp, advantages, cfg)
    if is_weights is not None:
        token_loss = token_loss * is_weights.detach()
    loss = aggregate(token_loss, mask, mode, normaliser, segment_ids)
    with torch.no_grad():
        log_ratio = torch.clamp(logp - old_logp, -20.0, 20.0)
        m = mask.to(logp.dtype)
        metrics = {
            "pg_loss": float(loss.detach()),
            "clip_fraction": float(masked_mean(info["clipped"].to(logp.dtype), m)),
            "clip_low_fraction": float(masked_mean(info["clipped_low"].to(logp.dtype), m)),
            "clip_high_fraction": float(masked_mean(info["clipped_high"].to(logp.dtype), m)),
            "dual_clip_fraction": float(masked_mean(info["dual_clipped"].to(logp.dtype), m)),
            "ratio_mean": float(masked_mean(info["ratio"], m)),
            "approx_kl": float(masked_mean(torch.exp(log_ratio) - 1.0 - log_ratio, m)),
            "ppo_kl": float(masked_mean(-log_ratio, m)),
            "num_tokens": float(m.sum()),
        }
    return loss, metrics


# ---------------------------------------------------------------- KL to the reference model
# KL to a FIXED reference policy (the initial weights, never a resumed checkpoint), per token.
#
# Schulman's estimators of KL(π_θ ‖ π_ref) from samples of π_θ, with δ = log π_θ − log π_ref:
#     k1: δ                                  unbiased, high variance, can be negative
#     k2: ½ δ²                               its gradient is the true KL gradient
#     k3: e^{−δ} + δ − 1  (≥ 0)              low variance; as verl's ``low_var_kl``: −δ clamped to ±20, the
#                                            result clamped to ±10, so one outlier token cannot blow up the loss
# The coefficient defaults to 0 (no reference model is loaded at all), as TRL does; DeepSeek-R1 used 0.001.

KLEstimator = Literal["k1", "k2", "k3"]


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLEstimator = "k3") -> torch.Tensor:
    """Per-token KL estimate of π_θ from π_ref (formulas in the module docstring)."""
    if kind == "k1":
        return logp - ref_logp
    if kind == "k2":
        return 0.5 * (logp - ref_logp).square()
    if kind == "k3":
        neg = torch.clamp(ref_logp - logp, -20.0, 20.0)
        return torch.clamp(torch.exp(neg) - neg - 1.0, -10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r}")


def kl_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    normaliser: float,
    kind: KLEstimator = "k3",
    mode: AggMode = "token-mean",
    segment_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The KL term aggregated like the policy loss (same global normaliser) and its local mean as a metric.

    The caller multiplies by its coefficient (``loss = pg + kl_coef · kl``), and skips this (and the reference
    forward pass) entirely when the coefficient is 0.
    """
    per_token = kl_estimate(logp, ref_logp.detach(), kind)
    loss = aggregate(per_token, mask, mode, normaliser, segment_ids)
    return loss, {"kl": float(masked_mean(per_token.detach(), mask))}


# ---------------------------------------------------------------- importance sampling
# Importance-sampling correction for the sampler ≠ trainer mismatch (vLLM bf16 vs trainer, or stale weights).
#
# With μ the sampler's logprobs (recorded by the rollout per token) and π the trainer's proximal policy
# (π_old when the trainer recomputes it — decoupled PPO), log w_t = clamp(log π_t − log μ_t, −20, 20):
#     token (TIS):     w_t = min(e^{log w_t}, C)                           truncated at cap C
#     sequence (MIS):  s_i = e^{mean_t log w_t} (geometric mean) or e^{Σ_t log w_t} (product);
#                      the whole sequence gets weight 0 when s_i ∉ [C_min, C_max]
#     token+sequence:  both (the peers' recommended default: seq-level masking is the safer filter)
# Weights carry no gradient; multiply them into the per-token policy loss (``policy_loss(is_weights=...)``).
# In bypass mode (the PPO ratio is taken against μ itself, no recompute pass) there is nothing to correct:
# use mode ``none`` and read the mismatch metrics from ``mismatch_metrics``.
#
# Metrics: ``is_weight_mean``; ``is_ess`` = (Σw)² / (n·Σw²) ∈ (0, 1] over trained tokens (1 = uniform weights);
# ``is_token_truncated_fraction``; ``is_seq_masked_fraction``; ``mismatch_kl_k1`` = mean(log μ − log π) and
# ``mismatch_kl_k3`` = mean(w − 1 − log w), both estimates of KL(μ ‖ π) from the sampler's own tokens.

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


# ---------------------------------------------------------------- the RL loss of a micro-batch
# The whole RL objective of one micro-batch, composed from the pieces:
#
#     L = Σ_{i,t} m·w_IS·ℓ_PPO / N  +  β_KL · Σ m·KL / N  −  β_H · Σ m·H / N        (N, the aggregation: see
#                                                                                 policy_loss; same for all terms)
# Every term is aggregated with the same mode and the same GLOBAL normaliser, so the micro-batch losses of an
# optimizer batch add up to the batch loss however the batch was split. The KL term needs ``ref_logp`` only
# when ``kl_coef > 0`` (the default is 0: no reference model). The entropy term needs ``entropy`` (per-token
# categorical entropy from ``logprobs.categorical_entropy``) only when ``entropy_coef != 0``; the step reports its mean as ``rl_entropy``.


@dataclass(frozen=True)
class LossConfig:
    """Settings of the RL objective (the trainer builds one from its settings)."""

    clip: ClipConfig = field(default_factory=ClipConfig)
    agg: AggMode = "token-mean"
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    entropy_coef: float = 0.0
    importance: ImportanceSampling = field(default_factory=ImportanceSampling)  # [trainer.importance]
    is_seq_agg: SeqAgg = "geo_mean"


@dataclass
class LossInputs:
    """Per-token tensors of one micro-batch, all ``(rows, tokens)`` except ``advantages`` (or ``(rows,)``).

    ``old_logp``: π_old (recomputed by the trainer, or the sampler's logprobs in bypass mode);
    ``sampler_logp``: the rollout's logprobs, for IS when ``old_logp`` was recomputed; ``segment_ids``: the
    sequence index of each token in packed rows (−1 on padding), None for one sequence per row.
    """

    logp: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logp: torch.Tensor | None = None
    sampler_logp: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    segment_ids: torch.Tensor | None = None


def rl_loss(batch: LossInputs, cfg: LossConfig, normaliser: float) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the RL loss and its metrics (``pg_loss``, ``clip_fraction``, ``kl``, ...)."""
    metrics: dict[str, float] = {}
    is_weights = None
    sampling = cfg.importance
    if sampling.mode != "none":
        if batch.sampler_logp is None:
            raise ValueError(f"importance sampling mode {sampling.mode!r} needs the sampler's logprobs")
        is_weights, is_metrics = importance_weights(
            batch.old_logp,
            batch.sampler_logp,
            batch.mask,
            mode=sampling.mode,
            cap=sampling.cap,
            seq_min=sampling.seq_min,
            seq_max=sampling.seq_max,
            seq_agg=cfg.is_seq_agg,
            segment_ids=batch.segment_ids,
        )
        metrics.update(is_metrics)
    loss, pg_metrics = policy_loss(
        batch.logp,
        batch.old_logp,
        batch.advantages,
        batch.mask,
        normaliser=normaliser,
        mode=cfg.agg,
        cfg=cfg.clip,
        segment_ids=batch.segment_ids,
        is_weights=is_weights,
    )
    metrics.update(pg_metrics)
    if cfg.kl_coef > 0:
        if batch.ref_logp is None:
            raise ValueError("kl_coef > 0 needs the reference model's logprobs (ref_logp)")
        kl, kl_metrics = kl_loss(
            batch.logp,
            batch.ref_logp,
            batch.mask,
            normaliser=normaliser,
            kind=cfg.kl_estimator,
            mode=cfg.agg,
            segment_ids=batch.segment_ids,
        )
        loss = loss + cfg.kl_coef * kl
        metrics.update(kl_metrics)
    if batch.entropy is not None and cfg.entropy_coef != 0:
        # Its mean is the step's ``rl_entropy`` (``step.StepResult``), not a metric of its own here.
        loss = loss - cfg.entropy_coef * aggregate(batch.entropy, batch.mask, cfg.agg, normaliser, batch.segment_ids)
    metrics["loss"] = float(loss.detach())
    return loss, metrics
