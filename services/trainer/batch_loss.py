"""The RL objective of one micro-batch: the trainer's tensors handed to ``rl.loss.rl_loss``; its metrics (the
typed ``metrics.RlMetrics``) as sums over a step's micro-batches (``RlSums``).

Two ways to use the sampler's logprobs μ (recorded per token by the rollout), chosen by ``[trainer.importance] mode``:
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
from services.trainer.metrics import RlMetrics, added, means, weighted
from services.trainer.packing import MicroBatch
from services.trainer.rl.loss import ClipConfig, LossConfig, LossInputs, mismatch_metrics, rl_loss


def loss_config(s: TrainerSettings) -> LossConfig:
    return LossConfig(
        clip=ClipConfig(clip_low=s.clip_low, clip_high=s.clip_high, dual_clip=s.dual_clip),
        agg=s.loss_agg,
        kl_coef=s.kl_coef,
        kl_estimator=s.kl_estimator,
        entropy_coef=s.entropy_coef,
        importance=s.importance,
    )


@dataclass
class Objective:
    """Callable with the ``step.RlLoss`` signature: (this micro-batch's loss × world, its metrics' ``RlSums``)."""

    settings: TrainerSettings
    cfg: LossConfig = field(init=False)

    def __post_init__(self) -> None:
        self.cfg = loss_config(self.settings)

    def __call__(
        self, logp: torch.Tensor, entropy: torch.Tensor, batch: MicroBatch, norms: dict[str, float]
    ) -> tuple[torch.Tensor, RlSums]:
        sampler = batch.fields["old_logp"]
        bypass = self.cfg.importance.mode == "none"
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
        metrics["staleness_mean"] = float((batch.fields["staleness"] * mask).sum() / mask.sum().clamp(min=1))
        tokens = metrics.pop("num_tokens")  # the micro-batch's trained tokens: the weight of its local means
        return loss * norms["world"], RlSums.of(RlMetrics(**metrics), tokens)


@dataclass
class RlSums:
    """The RL objective's metrics summed over micro-batches (and ranks), averaged once at the end (``means``).

    ``sums``: for a ``share`` metric (``pg_loss``, ``loss``: already a share of the step's value) the sum of the
    shares; for a ``token_mean`` metric Σ local mean × the micro-batch's trained tokens, so that ``means``
    weights each micro-batch by its trained tokens however the step was split. ``tokens``: those tokens' sum.
    """

    sums: RlMetrics = field(default_factory=RlMetrics)
    tokens: float = 0.0

    @classmethod
    def of(cls, metrics: RlMetrics, tokens: float) -> RlSums:
        """One micro-batch's metrics (local means and shares, as ``rl_loss`` returns them) and trained tokens."""
        return cls(weighted(metrics, tokens), tokens)

    def __add__(self, other: RlSums) -> RlSums:
        return RlSums(added(self.sums, other.sums), self.tokens + other.tokens)

    def means(self) -> RlMetrics:
        """Each metric over all micro-batches added: the token-weighted mean, or the summed share."""
        return means(self.sums, self.tokens)
