"""The whole RL objective of one micro-batch, composed from the pieces:

    L = Σ_{i,t} m·w_IS·ℓ_PPO / N  +  β_KL · Σ m·KL / N  −  β_H · Σ m·H / N        (N, the aggregation: see
                                                                                policy_loss; same for all terms)
Every term is aggregated with the same mode and the same GLOBAL normaliser, so the micro-batch losses of an
optimizer batch add up to the batch loss however the batch was split. The KL term needs ``ref_logp`` only
when ``kl_coef > 0`` (the default is 0: no reference model). The entropy term needs ``entropy`` (per-token
categorical entropy from ``entropy.py``) only when ``entropy_coef != 0``; the step reports its mean as ``rl_entropy``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from services.trainer.rl.importance import ISMode, SeqAgg, importance_weights
from services.trainer.rl.kl import KLEstimator, kl_loss
from services.trainer.rl.policy_loss import AggMode, ClipConfig, aggregate, policy_loss


@dataclass(frozen=True)
class LossConfig:
    """Settings of the RL objective (the trainer builds one from its settings)."""

    clip: ClipConfig = field(default_factory=ClipConfig)
    agg: AggMode = "token-mean"
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    entropy_coef: float = 0.0
    is_mode: ISMode = "none"
    is_cap: float = 2.0
    is_seq_min: float = 0.5
    is_seq_max: float = 2.0
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
    if cfg.is_mode != "none":
        if batch.sampler_logp is None:
            raise ValueError(f"importance sampling mode {cfg.is_mode!r} needs the sampler's logprobs")
        is_weights, is_metrics = importance_weights(
            batch.old_logp,
            batch.sampler_logp,
            batch.mask,
            mode=cfg.is_mode,
            cap=cfg.is_cap,
            seq_min=cfg.is_seq_min,
            seq_max=cfg.is_seq_max,
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
        # Its mean is the step's ``rl_entropy`` (``step_result``), not a metric of its own here.
        loss = loss - cfg.entropy_coef * aggregate(batch.entropy, batch.mask, cfg.agg, normaliser, batch.segment_ids)
    metrics["loss"] = float(loss.detach())
    return loss, metrics
