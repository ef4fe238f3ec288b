"""The RL objective of one micro-batch: the trainer's tensors handed to ``rl.loss.rl_loss``; its metrics summed
over a step's micro-batches (``RlMetrics``).

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
from services.trainer.metrics import RL_METRICS, RL_SHARES
from services.trainer.packing import MicroBatch
from services.trainer.rl.loss import ClipConfig, LossConfig, LossInputs, mismatch_metrics, rl_loss


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
    """Callable with the ``step.RlLoss`` signature: (this micro-batch's loss × world, its metrics for ``RlMetrics``)."""

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
        metrics["staleness_mean"] = float((batch.fields["staleness"] * mask).sum() / mask.sum().clamp(min=1))
        return loss * norms["world"], metrics


@dataclass
class RlMetrics:
    """The RL objective's metrics over many micro-batches (and ranks): sums, averaged once at the end.

    How each folds is its ``reduce`` in ``services.trainer.metrics``: ``shares`` are the metrics each micro-batch
    reports as its share of the step's value (``pg_loss``, ``loss``), so their sum is the value; ``token_sums``
    hold Σ local mean × ``tokens`` of the micro-batch for every other one, so that ``means`` weights each
    micro-batch by its trained tokens however the step was split. A metric the table does not define is an
    error, not a silently logged new name.
    """

    shares: dict[str, float] = field(default_factory=dict)
    token_sums: dict[str, float] = field(default_factory=dict)
    tokens: float = 0.0

    def add(self, metrics: dict[str, float]) -> None:
        """Fold in one micro-batch's metrics as ``Objective`` returns them (``num_tokens``: its trained tokens)."""
        n = metrics.get("num_tokens", 0.0)
        self.tokens += n
        for k, v in metrics.items():
            if k in RL_SHARES:
                self.shares[k] = self.shares.get(k, 0.0) + v
            elif k in RL_METRICS:
                self.token_sums[k] = self.token_sums.get(k, 0.0) + v * n
            elif k != "num_tokens":
                raise KeyError(f"the RL objective reports {k!r}, which services/trainer/metrics.py does not define")

    def means(self) -> dict[str, float]:
        """Each metric over all micro-batches added: the token-weighted mean, or the summed share."""
        n = max(self.tokens, 1.0)
        return {**{k: v / n for k, v in self.token_sums.items()}, **self.shares}
