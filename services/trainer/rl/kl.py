"""KL to a FIXED reference policy (the initial weights, never a resumed checkpoint), per token.

Schulman's estimators of KL(π_θ ‖ π_ref) from samples of π_θ, with δ = log π_θ − log π_ref:
    k1: δ                                  unbiased, high variance, can be negative
    k2: ½ δ²                               its gradient is the true KL gradient
    k3: e^{−δ} + δ − 1  (≥ 0)              low variance; as verl's ``low_var_kl``: −δ clamped to ±20, the
                                           result clamped to ±10, so one outlier token cannot blow up the loss
The coefficient defaults to 0 (no reference model is loaded at all), as TRL does; DeepSeek-R1 used 0.001.
"""

from __future__ import annotations

from typing import Literal

import torch

from services.trainer.rl.policy_loss import AggMode, aggregate, masked_mean

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
