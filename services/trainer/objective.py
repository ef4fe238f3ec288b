"""The RL objective of one micro-batch, assembled from the pure functions in ``services/trainer/rl``.

Bypass mode (peers.md §3): one optimizer step per batch and the PPO ratio taken against the sampler's
logprobs μ recorded by the rollout, so no extra "old policy" forward pass is needed; the ratio then also
covers the sampler/trainer mismatch and the staleness of off-policy samples. Optionally, sequences whose
geometric-mean ratio π/μ leaves ``[is_seq_min, is_seq_max]`` are masked out (MIS).

    loss = world · ( pg  +  kl_coef · KL(π ‖ π_ref)  −  entropy_coef · H )

each term aggregated with the same global normaliser (token-mean or seq-mean over the whole step), so the
sum over micro-batches and ranks is the full-batch loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.trainer.config import TrainerSettings
from services.trainer.packing import MicroBatch
from services.trainer.rl.importance import importance_weights, mismatch_metrics
from services.trainer.rl.kl import kl_loss
from services.trainer.rl.policy_loss import ClipConfig, aggregate, policy_loss

# Metrics that are already shares of the global loss (summed over micro-batches as they are); every other
# metric is a local mean, weighted by the micro-batch's trained tokens.
_ADDITIVE = {"pg_loss", "kl_loss", "entropy_loss", "loss"}


@dataclass(frozen=True)
class Objective:
    """Callable with the ``step.RlLoss`` signature."""

    settings: TrainerSettings

    def __call__(self, logp: torch.Tensor, entropy: torch.Tensor, batch: MicroBatch,
                 norms: dict[str, float]) -> tuple[torch.Tensor, dict[str, float]]:
        s = self.settings
        mask = batch.target_mask
        mode = s.loss_agg
        normaliser = norms["tokens"] if mode == "token-mean" else norms["sequences"]
        old = batch.fields["old_logp"]
        seg = batch.seq.to(mask.device)
        metrics: dict[str, float] = {}
        if s.is_seq_mask:
            weights, is_metrics = importance_weights(logp.detach(), old, mask, mode="sequence", seq_min=s.is_seq_min,
                                                     seq_max=s.is_seq_max, segment_ids=seg)
            mask = mask * (weights > 0).to(mask.dtype)
            metrics.update(is_metrics)
        else:
            metrics.update(mismatch_metrics(logp, old, mask))
        cfg = ClipConfig(clip_low=s.clip_low, clip_high=s.clip_high, dual_clip=s.dual_clip)
        loss, pg = policy_loss(logp, old, batch.fields["adv"], mask, normaliser=normaliser, mode=mode, cfg=cfg,
                               segment_ids=seg)
        metrics.update(pg)
        if s.kl_coef > 0:
            kl, kl_metrics = kl_loss(logp, batch.fields["ref_logp"].to(logp.device), mask, normaliser=normaliser,
                                     kind=s.kl_estimator, mode=mode, segment_ids=seg)
            loss = loss + s.kl_coef * kl
            metrics.update(kl_metrics, kl_loss=float(kl.detach()))
        if s.entropy_coef != 0:
            ent = aggregate(entropy, mask, mode, normaliser, seg)
            loss = loss - s.entropy_coef * ent
            metrics["entropy_loss"] = float(ent.detach())
        metrics["loss"] = float(loss.detach())
        metrics["lag_mean"] = float((batch.fields["lag"] * batch.target_mask).sum() / batch.target_mask.sum().clamp(min=1))
        return loss * norms["world"], weigh(metrics)


def weigh(metrics: dict[str, float]) -> dict[str, float]:
    """Turn local means into token-weighted sums (``*_wsum``) so they average correctly over micro-batches."""
    n = metrics.get("num_tokens", 0.0)
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if k == "num_tokens":
            out["weighted_tokens"] = n
        elif k in _ADDITIVE:
            out[k] = v
        else:
            out[f"{k}_wsum"] = v * n
    return out


def finish(sums: dict[str, float]) -> dict[str, float]:
    """Averages from the sums ``weigh`` produced (over all micro-batches and ranks)."""
    n = max(sums.get("weighted_tokens", 0.0), 1.0)
    out = {}
    for k, v in sums.items():
        if k.endswith("_wsum"):
            out[k[: -len("_wsum")]] = v / n
        elif k != "weighted_tokens":
            out[k] = v
    return out
