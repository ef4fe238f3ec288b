"""What one optimizer step did: its sums over micro-batches and ranks (``StepMetrics``) and its result
(``StepResult``), whose means are taken once, from the totals.

Sums travel as sums (one all-reduce for all of them) and each mean divides by its own count at the end, so a
step's numbers do not depend on how its batch was split into micro-batches or over ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from services.trainer.batch_loss import RlMetrics
from services.trainer.metrics import RL_METRICS


@dataclass
class StepMetrics:
    """Sums over the step's micro-batches: on one rank while it runs, then over all ranks (``total``)."""

    rl: RlMetrics = field(default_factory=RlMetrics)
    rl_entropy_sum: float = 0.0  # Σ entropy over trained RL tokens
    sft_entropy_sum: float = 0.0  # Σ entropy over trained demonstration tokens
    sft_loss_sum: float = 0.0  # Σ −log p over trained demonstration tokens
    tokens: float = 0.0  # real tokens through the model (prompts included), RL and SFT

    def total(self, sum_over_ranks: Callable[[list[float]], list[float]]) -> StepMetrics:
        """These sums added up over ranks by ``sum_over_ranks``, called once (one collective for all).

        Every rank runs the same objective, so every rank holds the same metrics: in the order the metrics table
        declares them, they line up.
        """
        shares = [k for k in RL_METRICS if k in self.rl.shares]
        token_sums = [k for k in RL_METRICS if k in self.rl.token_sums]
        flat = [self.rl_entropy_sum, self.sft_entropy_sum, self.sft_loss_sum, self.tokens, self.rl.tokens]
        flat += [self.rl.shares[k] for k in shares] + [self.rl.token_sums[k] for k in token_sums]
        v = sum_over_ranks(flat)
        n = 5 + len(shares)
        rl = RlMetrics(dict(zip(shares, v[5:n], strict=True)), dict(zip(token_sums, v[n:], strict=True)), v[4])
        return StepMetrics(rl, rl_entropy_sum=v[0], sft_entropy_sum=v[1], sft_loss_sum=v[2], tokens=v[3])


@dataclass(frozen=True)
class StepResult:
    """One optimizer step, the same on every rank: the totals, the step's counts, what the optimizer reported."""

    metrics: StepMetrics  # summed over all ranks
    rl_tokens: float  # trained RL tokens of the step (all ranks)
    rl_sequences: float
    sft_tokens: float  # demonstration tokens given; trained only when SFT micro-batches ran
    sft_weight: float  # the SFT loss's coefficient this step (``StepInput.sft_weight``)
    rl_micro_batches: int
    sft_micro_batches: int
    grad_norm: float
    lr: float
    seconds: float  # forward, backward and optimizer step

    @property
    def trained(self) -> bool:
        """Whether any token went through the model (a step without one took no optimizer step)."""
        return self.metrics.tokens > 0

    @property
    def micro_batches(self) -> int:
        return self.rl_micro_batches + self.sft_micro_batches

    @property
    def sft_trained_tokens(self) -> float:
        """Demonstration tokens the SFT loss saw (none when its weight was 0: the demonstrations were skipped)."""
        return self.sft_tokens if self.sft_micro_batches else 0.0

    def rl_entropy(self) -> float | None:
        """Mean entropy over the trained RL tokens (RED's RL input); None when there was none."""
        return _mean(self.metrics.rl_entropy_sum, self.rl_tokens)

    def sft_entropy(self) -> float | None:
        """Mean entropy over the trained demonstration tokens (RED's SFT input); None without SFT."""
        return _mean(self.metrics.sft_entropy_sum, self.sft_trained_tokens)

    def sft_loss(self) -> float | None:
        """Token-mean cross-entropy on the demonstrations, before the SFT weight; None without SFT."""
        return _mean(self.metrics.sft_loss_sum, self.sft_trained_tokens)


def _mean(total: float, count: float) -> float | None:
    # None, not 0: an entropy of 0 would read as a collapsed policy, and RED must skip a side it did not measure.
    return total / count if count > 0 else None
