"""Sampler math on hand-made distributions: truncation, greedy, seeds, raw vs processed logprobs."""

from __future__ import annotations

import math

import torch

from services.inference.sampling import SamplingParams, _truncate, process_logits, sample

# probabilities 1/2, 1/4, 1/8, 1/8: exact in binary, so cumulative masses compare exactly
LOGITS = torch.log(torch.tensor([[0.125, 0.5, 0.125, 0.25]]))


def kept(logits: torch.Tensor) -> list[int]:
    return torch.isfinite(logits[0]).nonzero().flatten().tolist()


def test_top_p_keeps_the_smallest_set_reaching_p():
    assert kept(_truncate(LOGITS, torch.tensor([0]), torch.tensor([0.75]))) == [1, 3]
    assert kept(_truncate(LOGITS, torch.tensor([0]), torch.tensor([0.5]))) == [1]
    three = kept(_truncate(LOGITS, torch.tensor([0]), torch.tensor([0.8])))  # 1/2+1/4+1/8 reaches 0.8
    assert len(three) == 3 and {1, 3} <= set(three)
    assert kept(_truncate(LOGITS, torch.tensor([0]), torch.tensor([0.01]))) == [1]


def test_top_k_and_top_p_together():
    assert kept(_truncate(LOGITS, torch.tensor([2]), torch.tensor([1.0]))) == [1, 3]
    assert kept(_truncate(LOGITS, torch.tensor([3]), torch.tensor([0.5]))) == [1]


def test_temperature_scales_and_banned_ids_are_masked():
    params = [SamplingParams(max_tokens=1, temperature=2.0)]
    out = process_logits(LOGITS, params, [[1]])
    assert out[0, 1] == float("-inf")
    assert math.isclose(float(out[0, 3]), math.log(0.25) / 2, rel_tol=1e-6)


def test_greedy_picks_argmax_and_raw_logprob_is_the_models():
    res = sample(LOGITS, [SamplingParams(max_tokens=1, temperature=0.0)], [None], [[]])
    assert res.tokens == [1] and math.isclose(res.logprobs[0], math.log(0.5), rel_tol=1e-6)


def test_raw_vs_processed_logprobs():
    params = [SamplingParams(max_tokens=1, temperature=1.0, top_p=0.5)]  # only token 1 survives
    raw = sample(LOGITS, params, [torch.Generator().manual_seed(0)], [[]], "raw_logprobs")
    processed = sample(LOGITS, params, [torch.Generator().manual_seed(0)], [[]], "processed_logprobs")
    assert raw.tokens == processed.tokens == [1]
    assert math.isclose(raw.logprobs[0], math.log(0.5), rel_tol=1e-6)
    assert abs(processed.logprobs[0]) < 1e-6  # the truncated distribution puts all mass on it


def test_seeded_rows_do_not_depend_on_the_rest_of_the_batch():
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(1))
    p = SamplingParams(max_tokens=1)
    alone = [sample(logits, [p], [torch.Generator().manual_seed(s)], [[]]).tokens[0] for s in range(20)]
    batch = torch.cat([torch.randn(3, 50), logits])
    mixed = [
        sample(batch, [p] * 4, [None, None, None, torch.Generator().manual_seed(s)], [[]] * 4).tokens[3]
        for s in range(20)
    ]
    assert alone == mixed and len(set(alone)) > 1


def test_sampling_frequencies_follow_the_distribution():
    gen = torch.Generator().manual_seed(0)
    logits = LOGITS.expand(4000, -1).contiguous()
    p = [SamplingParams(max_tokens=1)] * 4000
    tokens = torch.tensor(sample(logits, p, [None] * 4000, [[]] * 4000, default_generator=gen).tokens)
    freq = torch.bincount(tokens, minlength=4).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.125, 0.5, 0.125, 0.25]), atol=0.03)


def test_top_logprobs_returned_when_asked():
    res = sample(LOGITS, [SamplingParams(max_tokens=1, temperature=0.0, logprobs=2)], [None], [[]])
    assert list(res.top[0]) == [1, 3]
