"""The forward pass's head: logprobs of the targets and the categorical entropy, at the sampling temperature."""

from __future__ import annotations

import torch

from services.trainer.logprobs import _head_chunk


def test_head_chunk_divides_the_logits_by_the_temperature():
    head = torch.nn.Linear(3, 3, bias=False)
    torch.nn.init.eye_(head.weight)  # logits = hidden state
    hidden = torch.tensor([[2.0, 0.0, -1.0], [2.0, 0.0, -1.0]])
    logp, entropy = _head_chunk(head, hidden, torch.tensor([0, 2]), 2.0)
    # Temperature 2: the distribution of (1, 0, −0.5). Z = e + 1 + e^−0.5 = 4.32481, ln Z = 1.46437;
    # H = ln Z − Σ p·z = 1.46437 − (0.62853 − 0.5·0.14024) = 0.90596 (0.52427 at temperature 1).
    torch.testing.assert_close(entropy, torch.tensor([0.9059593, 0.9059593]))
    torch.testing.assert_close(logp, torch.tensor([1.0 - 1.4643688, -0.5 - 1.4643688]))
