"""THE entropy estimator, used on both the RL and the SFT side (RED compares the two, so they must match).

Categorical entropy of the full next-token distribution, H = logsumexp(z) − Σ_v softmax(z)_v · z_v, per
position, averaged over trained tokens. (RED-CoDA compared the SFT side's categorical entropy with the RL side's
sampled-token NLL; those are different quantities.)
"""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-position categorical entropy of ``softmax(logits / temperature)`` over the last dim (float32 math)."""
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    logp = torch.log_softmax(z, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def entropy_from_logprobs(logp_all: torch.Tensor) -> torch.Tensor:
    """The same entropy from full-vocabulary log-probabilities ``log_softmax(z)``: −Σ p·log p."""
    return -(logp_all.exp() * logp_all).sum(-1)


class EntropyMeter:
    """Token-weighted mean entropy over many micro-batches: ``Σ m·H / Σ m`` across every ``add``.

    One per side and step (RL tokens, SFT target tokens); feeds ``red.REDState.observe``.
    """

    def __init__(self) -> None:
        self.total = 0.0
        self.tokens = 0.0

    def add(self, entropy: torch.Tensor, mask: torch.Tensor) -> None:
        m = mask.to(torch.float32)
        self.total += float((entropy.detach().float() * m).sum())
        self.tokens += float(m.sum())

    def mean(self) -> float | None:
        """The mean so far, or None when no token was added."""
        return self.total / self.tokens if self.tokens > 0 else None
