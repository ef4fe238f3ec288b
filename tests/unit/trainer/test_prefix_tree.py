"""Prefix-tree packing: samples that begin alike share one copy of their common part, with the same logprobs and
the same gradient as the plain layout, and fewer tokens through the model."""

from __future__ import annotations

import random

import torch

from services.trainer.logprobs import PolicyLogprobs, batch_inputs
from services.trainer.packing import TrainSeq, loss_view, pack, pack_shared
from tests.unit.trainer.test_packing import _seqs
from tests.unit.trainer.tiny import tiny_qwen2


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


def _episodes(seed: int = 0) -> list[TrainSeq]:
    """Multi-turn samples of one prompt: a search (trained), its observation (not trained), an answer (trained).
    Samples 0-2 write the same search and so read the same observation; 0 and 1 also answer alike for 2
    tokens; 3 searches differently; 4 stops after its search (a prefix of the others, then its own end)."""
    rng = random.Random(seed)

    def toks(n: int) -> list[int]:
        return [rng.randrange(64) for _ in range(n)]

    prompt, search, obs = toks(12), toks(5), toks(20)
    other_search, other_obs = toks(4), toks(18)
    common_answer = toks(2)
    parts = [
        (search, obs, common_answer + toks(3)),
        (search, obs, common_answer + toks(4)),
        (search, obs, toks(6)),
        (other_search, other_obs, toks(5)),
        (search, [], []),
    ]
    out = []
    for i, (s, o, a) in enumerate(parts):
        tokens = prompt + s + o + a
        mask = [0] * len(prompt) + [1] * len(s) + [0] * len(o) + [1] * len(a)
        n = len(tokens)
        # Each sample its own advantage and sampler logprobs, also on the tokens it shares with others.
        fields = {"adv": [1.5 - i] * n, "old": [rng.uniform(-3, 0) for _ in range(n)]}
        out.append(TrainSeq(tokens, mask, fields, i))
    return out


def _values_and_grads(model, batches):
    """Each sample's trained-token logprobs, and the gradient of Σ adv · old · logp over trained tokens."""
    model.zero_grad()
    policy = PolicyLogprobs(model, chunk=5)
    values: dict[int, list[float]] = {}
    for b in batches:
        logp, ent = policy(**batch_inputs(b, torch.device("cpu")))
        logp, _, view = loss_view(b, logp, ent)
        (logp * view.fields["adv"] * view.fields.get("old", torch.ones_like(logp)) * view.target_mask).sum().backward()
        flat = (view.seq.flatten().tolist(), logp.flatten().tolist(), view.target_mask.flatten().tolist())
        for s, v, m in zip(*flat, strict=True):
            if m:
                values.setdefault(s, []).append(v)
    return values, [p.grad.clone() for p in model.parameters()]


def _same(model, plain, shared):
    want, want_grads = _values_and_grads(model, plain)
    got, got_grads = _values_and_grads(model, shared)
    assert sorted(got) == sorted(want)
    for i in want:  # each trained token's logprob, in order within its sequence
        assert torch.allclose(torch.tensor(got[i]), torch.tensor(want[i]), atol=1e-5), i
    for g, w in zip(got_grads, want_grads, strict=True):
        assert torch.allclose(g, w, atol=1e-5)


def test_shared_prompts_give_the_same_logprobs_and_gradients_from_fewer_tokens():
    seqs = [*_groups(3, 4), TrainSeq([1, 2, 3, 4, 5], [0, 0, 1, 1, 1], {"adv": [0.5] * 5}, 12)]
    model = tiny_qwen2()
    plain, shared = pack(seqs, 64), pack_shared(seqs, 64)
    _same(model, plain, shared)
    # Each prompt (minus its last token, which every continuation keeps) is in the batch once, not 4 times.
    assert sum(b.num_tokens for b in shared) < 0.6 * sum(b.num_tokens for b in plain)
    assert all(b.attention_mask.dim() == 4 for b in shared)


def test_samples_that_search_alike_share_the_search_and_its_observation():
    seqs = _episodes()
    model = tiny_qwen2()
    plain, shared = pack(seqs, 512), pack_shared(seqs, 512)
    _same(model, plain, shared)
    (b,) = shared
    # Positions through the model, counted by hand (a position is shared while the token it reads and the one it
    # predicts agree, so each branch keeps the position that predicts its first own token):
    prompt, search, obs = 12, 5, 20
    distinct = (
        (prompt - 1)  # the prompt, once for all five
        + (4 + 18 + 5 + 1)  # sample 3 after the prompt
        + search  # the common search of 0, 1, 2, 4
        + 1  # sample 4's end
        + obs  # the common observation of 0, 1, 2
        + (6 + 1)  # sample 2's answer
        + 2  # the first two answer tokens of 0 and 1
        + (3 + 1)
        + (4 + 1)  # the rest of 0 and of 1
    )
    assert b.num_tokens == distinct
    assert b.num_tokens < 0.5 * sum(p.num_tokens for p in plain)  # 83 of 184
    # The shared search is trained for samples 0, 1, 2 and 4: one position, four loss entries.
    assert b.slots is not None and len(b.slots.index) == sum(sum(s.mask[1:]) for s in seqs)
    assert len(set(b.slots.index.tolist())) < len(b.slots.index)


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
    trained = sum(len(b.slots.index) for b in batches)
    assert trained == sum(sum(s.mask[1:]) for s in seqs)
    prompt_starts = sum(int(((b.position_ids == 0) & (b.seq >= 0)).sum()) for b in batches)
    assert 1 < prompt_starts < len(seqs)  # several copies of the prompt, fewer than one per sample
    _same(tiny_qwen2(), pack(seqs, 40), batches)


def test_sequences_without_a_shared_prompt_pack_as_before():
    seqs = _seqs([5, 17, 1, 9, 30, 2, 12])  # distinct random prompts
    shared = pack_shared(seqs, token_budget=40)
    assert sum(b.num_tokens for b in shared) == sum(len(s.tokens) for s in seqs)


def test_a_tree_is_as_large_as_its_samples_less_what_each_shares_with_an_earlier_one():
    """The size ``pack_shared`` budgets with (sample by sample) is the size of the tree it builds."""
    from services.trainer.packing import _roots, _shared_positions

    seqs = _episodes()
    (root,) = _roots(seqs, cap=10_000, min_prefix=8)
    grown = sum(
        len(s.tokens) - max((_shared_positions(s.tokens, m.tokens) for m in seqs[:i]), default=0)
        for i, s in enumerate(seqs)
    )
    assert root.size == grown == 83
