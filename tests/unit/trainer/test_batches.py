"""Groups → training sequences: advantages per sample, staleness drop, per-token fields."""

from __future__ import annotations

import pytest

from services.trainer.batches import group_check, teaching, to_sequences
from services.trainer.rl.advantages import trajectory_advantages
from shared.stream import sample_staleness
from tests.factories import make_group, make_sample


def test_sequences_carry_advantage_sampler_logprobs_and_lag():
    g = make_group(n=3, version=2)  # rewards 0, 1, 2; trained tokens sampled by version 2
    adv, _ = trajectory_advantages([g])
    seqs, dropped = to_sequences([g], adv, version=3, max_staleness=1, policy="drop")
    assert dropped == 0 and len(seqs) == 3
    assert [s.fields["adv"][0] for s in seqs] == pytest.approx([-1.0, 0.0, 1.0], abs=1e-5)  # (r − 1) / std 1
    s = seqs[0]
    assert s.tokens == g.samples[0].token_ids and s.mask == g.samples[0].loss_mask
    assert s.fields["old_logp"] == g.samples[0].logprobs
    assert s.fields["staleness"] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]  # 1 version behind, on trained tokens only


def test_stale_samples_dropped_or_kept_and_baseline_unchanged():
    g = make_group(n=2, version=2)
    adv, _ = trajectory_advantages([g])
    seqs, dropped = to_sequences([g], adv, version=5, max_staleness=1, policy="drop")
    assert seqs == [] and dropped == 2
    kept, dropped = to_sequences([g], adv, version=5, max_staleness=1, policy="correct")
    assert len(kept) == 2 and dropped == 0 and kept[0].fields["staleness"][-1] == 3.0


def test_sample_without_trained_tokens_is_skipped():
    g = make_group(n=2)
    g.samples[0] = make_sample("s0", generated=0)
    adv, _ = trajectory_advantages([g])
    seqs, _ = to_sequences([g], adv, version=2, max_staleness=0, policy="drop")
    assert [len(s.tokens) for s in seqs] == [7]
    assert sample_staleness(g.samples[0], 9) == 0


def test_group_check_refuses_what_the_model_cannot_train_on():
    check = group_check(vocab_size=17)  # make_sample's token ids are 10..16
    check(make_group())
    oov = make_group()
    oov.samples[1].token_ids[2] = 17
    with pytest.raises(ValueError, match="token id 17 outside the model's vocabulary of 17"):
        check(oov)
    negative = make_group()
    negative.samples[0].token_ids[0] = -1
    with pytest.raises(ValueError, match="token id -1"):
        check(negative)
    nan = make_group()
    nan.samples[0].logprobs[-1] = float("nan")
    with pytest.raises(ValueError, match="non-finite logprob"):
        check(nan)
    inf = make_group()
    inf.samples[0].reward_components["f1"] = float("inf")
    with pytest.raises(ValueError, match="non-finite reward"):
        check(inf)


def test_samples_without_an_advantage_are_left_out_of_the_step():
    """Rewards 0, 1, 2 → advantages −1, 0, +1: the middle one teaches nothing. A group of equal rewards
    (0.1 three times: the float mean is an ulp off) gets exactly 0 and is left out whole."""
    taught, flat = make_group("q1", n=3), make_group("q2", n=3)
    for smp in flat.samples:
        smp.reward = 0.1
    adv, result = trajectory_advantages([taught, flat])
    assert result.num_zero_variance == 1
    assert [adv[f"{flat.group_id}/{s.sample_id}"] for s in flat.samples] == [0.0, 0.0, 0.0]
    seqs, _ = to_sequences([taught, flat], adv, version=2, max_staleness=0, policy="drop")
    kept, skipped = teaching(seqs)
    assert skipped == 4 and [s.fields["adv"][0] for s in kept] == pytest.approx([-1.0, 1.0], abs=1e-5)
    assert [s.index for s in kept] == [0, 1]
