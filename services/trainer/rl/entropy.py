"""THE entropy estimator, used on both the RL and the SFT side (RED compares the two, so they must match).

Categorical entropy of the full next-token distribution, H = −Σ_v p_v · log p_v, per position; the step
averages it over trained tokens (``step_result.StepMetrics``). The policy's forward pass
(``logprobs.HeadLogprobs``, or ``logprobs._head_chunk`` for heads it cannot fuse) is the one place it is computed, so
every entropy the trainer reports or optimises is this one (``HeadLogprobs.backward`` holds its gradient).
(RED-CoDA compared the SFT side's categorical entropy with the RL side's sampled-token NLL; those are
different quantities.)
"""

from __future__ import annotations

import torch


def categorical_entropy(logp_all: torch.Tensor) -> torch.Tensor:
    """Per-position entropy −Σ p·log p from full-vocabulary log-probabilities (``log_softmax`` of the logits).

    From log-probabilities, in float32 (or float64 if given that): a token whose probability underflows to 0
    still has a finite log p here, so its term is 0·(−200) = 0, where log(softmax(z)) would give 0·(−inf) = NaN.
    """
    logp = logp_all.to(torch.promote_types(logp_all.dtype, torch.float32))
    return -(logp.exp() * logp).sum(-1)
