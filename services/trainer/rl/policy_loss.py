"""PPO clipped surrogate (symmetric, clip-higher, dual-clip) and loss aggregation that does not depend on how
the optimizer batch is split into micro-batches.

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

from dataclasses import dataclass
from typing import Literal

import torch

from services.trainer.rl.segments import segment_sums

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
