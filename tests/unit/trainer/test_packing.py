"""Packing: no attention across packed samples (packed logprobs == one-by-one logprobs), layout details."""

from __future__ import annotations

import random

import pytest
import torch

from services.trainer.logprobs import PolicyLogprobs, batch_inputs, sequence_logprobs
from services.trainer.packing import TrainSeq, empty_batch, pack, pack_shared, pad
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


def _groups(prompts: int, per_group: int, vocab: int = 64, seed: int = 0) -> list[TrainSeq]:
    """GRPO-shaped samples: ``per_group`` continuations of each of ``prompts`` prompts."""
    rng = random.Random(seed)
    out = []
    for _ in range(prompts):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(9, 14))]
        for _ in range(per_group):
            answer = [rng.randrange(vocab) for _ in range(rng.randint(1, 8))]
            i, n = len(out), len(prompt) + len(answer)
            out.append(TrainSeq(prompt + answer, [0] * len(prompt) + [1] * len(answer), {"adv": [i - 5.0] * n}, i))
    return out


def _logprobs_and_grads(model, batches):
    model.zero_grad()
    policy = PolicyLogprobs(model, chunk=5)
    values: dict[int, list[float]] = {}
    for b in batches:
        logp, _ = policy(**batch_inputs(b, torch.device("cpu")))
        (logp * b.fields["adv"] * b.target_mask).sum().backward()
        flat = (b.seq.flatten().tolist(), logp.flatten().tolist(), b.target_mask.flatten().tolist())
        for s, v, m in zip(*flat, strict=True):
            if m:
                values.setdefault(s, []).append(v)
    return values, [p.grad.clone() for p in model.parameters()]


def test_shared_prompts_give_the_same_logprobs_and_gradients_from_fewer_tokens():
    seqs = [*_groups(3, 4), TrainSeq([1, 2, 3, 4, 5], [0, 0, 1, 1, 1], {"adv": [0.5] * 5}, 12)]
    model = tiny_qwen2()
    plain, shared = pack(seqs, 64), pack_shared(seqs, 64)
    want, want_grads = _logprobs_and_grads(model, plain)
    got, got_grads = _logprobs_and_grads(model, shared)
    assert sorted(got) == sorted(want) == list(range(13))
    for i in want:  # each trained token's logprob, in order within its sequence
        assert torch.allclose(torch.tensor(got[i]), torch.tensor(want[i]), atol=1e-5), i
    for g, w in zip(got_grads, want_grads, strict=True):
        assert torch.allclose(g, w, atol=1e-5)
    # Each prompt (minus its last token, which every continuation keeps) is in the batch once, not 4 times.
    assert sum(b.num_tokens for b in shared) < 0.6 * sum(b.num_tokens for b in plain)
    assert all(b.attention_mask.dim() == 4 for b in shared)


def test_shared_prompt_without_its_mask_would_leak_between_continuations():
    """Control: the same tree row under a plain causal mask lets a continuation see its siblings."""
    seqs = _groups(1, 3)
    (b,) = pack_shared(seqs, 64)
    model = tiny_qwen2()
    policy = PolicyLogprobs(model)
    with torch.no_grad():
        good, _ = policy(**batch_inputs(b, torch.device("cpu")))
        leaky = dict(batch_inputs(b, torch.device("cpu")), attention_mask=None)
        leaky["position_ids"] = torch.arange(b.input_ids.shape[1]).unsqueeze(0)
        bad, _ = policy(**leaky)
    last = (b.seq == 2) & (b.target_mask > 0)
    assert not torch.allclose(good[last], bad[last], atol=1e-3)


def test_shared_group_larger_than_the_budget_is_split_with_its_own_prompt_copies():
    seqs = _groups(1, 8)
    batches = pack_shared(seqs, token_budget=40)
    assert all(b.input_ids.numel() <= 40 for b in batches)
    trained = sum(int(b.target_mask.sum()) for b in batches)
    assert trained == sum(sum(s.mask[1:]) for s in seqs)
    prompt_starts = sum(int(((b.position_ids == 0) & (b.seq >= 0)).sum()) for b in batches)
    assert 1 < prompt_starts < len(seqs)  # several copies of the prompt, fewer than one per sample


def test_sequences_without_a_shared_prompt_pack_as_before():
    seqs = _seqs([5, 17, 1, 9, 30, 2, 12])  # distinct random prompts
    shared = pack_shared(seqs, token_budget=40)
    assert sum(b.num_tokens for b in shared) == sum(len(s.tokens) for s in seqs)
