"""The RL objective of one micro-batch: the trainer's tensors handed to ``rl.loss.rl_loss``.

Two ways to use the sampler's logprobs μ (recorded per token by the rollout), chosen by ``is_mode``:
  ``none`` (default; verl calls it "bypass" mode): one optimizer step per batch with the PPO ratio taken against
      μ itself, so no extra forward pass for π_old; the clipped ratio covers both the sampler/trainer
      mismatch and the staleness of off-policy samples;
  ``token`` / ``sequence`` / ``token+sequence`` (decoupled): π_old is the current policy (detached, ratio 1),
      and the truncated / sequence-masked importance weights π/μ do the off-policy correction.
All terms share the step's global normaliser; DeepSpeed averages gradients over ranks, hence ``× world``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from services.trainer.config import TrainerSettings
from services.trainer.packing import MicroBatch
from services.trainer.rl.importance import mismatch_metrics
from services.trainer.rl.loss import LossConfig, LossInputs, rl_loss
from services.trainer.rl.policy_loss import ClipConfig

# Metrics that are already shares of the global loss (summed over micro-batches as they are); every other
# metric is a local mean, weighted by the micro-batch's trained tokens.
_ADDITIVE = {"pg_loss", "loss"}


def loss_config(s: TrainerSettings) -> LossConfig:
    return LossConfig(
        clip=ClipConfig(clip_low=s.clip_low, clip_high=s.clip_high, dual_clip=s.dual_clip),
        agg=s.loss_agg,
        kl_coef=s.kl_coef,
        kl_estimator=s.kl_estimator,
        entropy_coef=s.entropy_coef,
        is_mode=s.is_mode,
        is_cap=s.is_cap,
        is_seq_min=s.is_seq_min,
        is_seq_max=s.is_seq_max,
    )


@dataclass
class Objective:
    """Callable with the ``step.RlLoss`` signature."""

    settings: TrainerSettings
    cfg: LossConfig = field(init=False)

    def __post_init__(self) -> None:
        self.cfg = loss_config(self.settings)

    def __call__(
        self, logp: torch.Tensor, entropy: torch.Tensor, batch: MicroBatch, norms: dict[str, float]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        sampler = batch.fields["old_logp"]
        bypass = self.cfg.is_mode == "none"
        inputs = LossInputs(
            logp=logp,
            old_logp=sampler if bypass else logp.detach(),
            advantages=batch.fields["adv"],
            mask=batch.target_mask,
            ref_logp=batch.fields.get("ref_logp"),
            sampler_logp=None if bypass else sampler,
            entropy=entropy,
            segment_ids=batch.seq.to(logp.device),
        )
        normaliser = norms["tokens"] if self.cfg.agg == "token-mean" else norms["sequences"]
        loss, metrics = rl_loss(inputs, self.cfg, normaliser)
        if bypass:  # how far the trainer's logprobs are from the sampler's (0 on-policy with synced weights)
            metrics.update(mismatch_metrics(logp, sampler, batch.target_mask))
        mask = batch.target_mask
        metrics["lag_mean"] = float((batch.fields["lag"] * mask).sum() / mask.sum().clamp(min=1))
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
