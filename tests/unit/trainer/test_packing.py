"""Packing: no attention across packed samples (packed logprobs == one-by-one logprobs), layout details."""

from __future__ import annotations

import random

import pytest
import torch

from services.trainer.logprobs import PolicyLogprobs, sequence_logprobs
from services.trainer.packing import TrainSeq, empty_batch, pack, pad
from tests.unit.trainer.tiny import tiny_qwen2


def _seqs(lengths: list[int], vocab: int = 64) -> list[TrainSeq]:
    rng = random.Random(1)
    out = []
    for i, n in enumerate(lengths):
        tokens = [rng.randrange(vocab) for _ in range(n)]
        mask = [0] * (n // 3) + [1] * (n - n // 3)
        out.append(TrainSeq(tokens=tokens, mask=mask, fields={"old": [float(t) for t in tokens]}, index=i))
    return out


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_equal_unpacked(attn):
    model = tiny_qwen2()
    model.config._attn_implementation = attn
    policy = PolicyLogprobs(model, chunk=7)
    seqs = _seqs([5, 17, 1, 9, 30, 2, 12])
    layouts = [pack(seqs, token_budget=40), pack(seqs, token_budget=80, row_tokens=40)]
    for packed in layouts:
        assert max(int((b.position_ids == 0).sum()) for b in packed) >= 3  # several samples share a row
        got = sequence_logprobs(policy, packed, torch.device("cpu"))
        for s in seqs:
            alone = sequence_logprobs(policy, pack([s], token_budget=1000), torch.device("cpu"))[s.index]
            assert len(got[s.index]) == len(s.tokens)
            assert torch.allclose(torch.tensor(got[s.index]), torch.tensor(alone), atol=1e-5), s.index
    # The same holds for the padded layout (attention mask instead of position restarts).
    padded = sequence_logprobs(policy, pad(seqs, token_budget=64), torch.device("cpu"))
    for s in seqs:
        assert torch.allclose(torch.tensor(padded[s.index]), torch.tensor(got[s.index]), atol=1e-5)


def test_packing_would_leak_without_position_restarts():
    """Control: the same row with one running position count (plain causal mask) gives other logprobs."""
    model = tiny_qwen2()
    policy = PolicyLogprobs(model)
    seqs = _seqs([6, 6])
    (b,) = pack(seqs, token_budget=12, row_tokens=12)
    leaky = torch.arange(12).unsqueeze(0)
    with torch.no_grad():
        good, _ = policy(b.input_ids, b.position_ids, None, b.targets, b.seq >= 0)
        bad, _ = policy(b.input_ids, leaky, None, b.targets, b.seq >= 0)
    second = b.seq[0] == b.seq[0, -1]
    assert not torch.allclose(good[0, second], bad[0, second], atol=1e-3)


def test_layout_targets_and_fields_shift_by_one():
    seqs = _seqs([4, 3])
    (b,) = pack(seqs, token_budget=8, row_tokens=8)
    # Longest first: the 4-token sequence, then the 3-token one.
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    t0, t1 = seqs[0].tokens, seqs[1].tokens
    assert b.targets.tolist() == [[t0[1], t0[2], t0[3], 0, t1[1], t1[2], 0]]
    assert b.target_mask.tolist() == [[1, 1, 1, 0, 1, 1, 0]]  # masks [0,1,1,1] and [0,1,1], shifted left
    assert b.fields["old"].tolist() == [
        [float(x) for x in (t0[1], t0[2], t0[3])] + [0.0] + [float(t1[1]), float(t1[2]), 0.0]
    ]
    assert b.attention_mask is None and b.num_tokens == 7


def test_rows_capped_by_longest_sequence_and_grouped_by_budget():
    seqs = _seqs([8, 5, 3, 3, 2, 1])
    batches = pack(seqs, token_budget=16)  # rows of at most 8 tokens: [8], [5+3], [3+2+1]; two rows per batch
    assert [tuple(b.input_ids.shape) for b in batches] == [(2, 8), (1, 6)]
    assert sum(b.num_tokens for b in batches) == 22


def test_budget_respected_and_oversized_sequence_alone():
    seqs = _seqs([10, 10, 10, 25, 3])
    batches = pack(seqs, token_budget=20)
    assert sorted(int(b.num_tokens) for b in batches) == [13, 20, 25]
    assert sum(b.num_tokens for b in batches) == 58


def test_padded_layout_counts_padding():
    seqs = _seqs([10, 2, 2, 2])
    (b,) = pad(seqs, token_budget=40)
    assert b.input_ids.shape == (4, 10) and b.num_tokens == 16 and b.num_slots == 40
    assert b.attention_mask.sum().item() == 16


def test_empty_batch_trains_nothing():
    b = empty_batch(["old"])
    assert b.num_tokens == 0 and b.target_mask.sum() == 0
