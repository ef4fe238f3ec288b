"""PPO loss, aggregation and micro-batch-split invariance."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.trainer.rl.loss import (
    ClipConfig,
    aggregate,
    loss_normaliser,
    policy_loss,
    ppo_token_loss,
)


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_clip_inactive_when_ratio_is_one():
    logp = t([-1.0, -2.0, -0.5])
    loss, info = ppo_token_loss(logp, logp.clone(), t(2.0), ClipConfig(0.2, 0.28, 3.0))
    assert loss.tolist() == [[-2.0, -2.0, -2.0]]
    assert not info["clipped"].any()


def test_symmetric_clip_hand_computed():
    # ratios e^{ln 1.5}=1.5 and e^{ln 0.5}=0.5 with A=+1 and A=−1
    old = t([0.0, 0.0])
    logp = t([math.log(1.5), math.log(0.5)])
    pos, info = ppo_token_loss(logp, old, t(1.0), ClipConfig(0.2, 0.2))
    # A>0: max(−1.5, −1.2) = −1.2 (clipped);  ratio 0.5: max(−0.5, −0.8) = −0.5 (not clipped)
    assert pos[0].tolist() == pytest.approx([-1.2, -0.5])
    assert info["clipped"].tolist() == [[True, False]]
    neg, info = ppo_token_loss(logp, old, t(-1.0), ClipConfig(0.2, 0.2))
    # A<0: ratio 1.5: max(1.5, 1.2) = 1.5; ratio 0.5: max(0.5, 0.8) = 0.8 (clipped low)
    assert neg[0].tolist() == pytest.approx([1.5, 0.8])
    assert info["clipped_low"].tolist() == [[False, True]]


def test_clip_higher_asymmetric():
    old = t([0.0])
    logp = t([math.log(1.25)])
    sym, _ = ppo_token_loss(logp, old, t(1.0), ClipConfig(0.2, 0.2))
    high, _ = ppo_token_loss(logp, old, t(1.0), ClipConfig(0.2, 0.28))
    assert sym.item() == pytest.approx(-1.2) and high.item() == pytest.approx(-1.25)


def test_dual_clip_caps_negative_advantage():
    old = t([0.0, 0.0])
    logp = t([math.log(5.0), math.log(2.0)])
    loss, info = ppo_token_loss(logp, old, t(-1.0), ClipConfig(0.2, 0.2, dual_clip=3.0))
    # ratio 5: max(5, 1.2) = 5 → min(5, 3) = 3 (dual-clipped); ratio 2: 2 < 3 stays
    assert loss[0].tolist() == pytest.approx([3.0, 2.0])
    assert info["dual_clipped"].tolist() == [[True, False]]
    pos, _ = ppo_token_loss(logp, old, t(1.0), ClipConfig(0.2, 0.2, dual_clip=3.0))
    assert pos[0].tolist() == pytest.approx([-1.2, -1.2])  # positive A untouched by dual clip
    with pytest.raises(ValueError):
        ClipConfig(dual_clip=1.0)


def test_aggregation_modes_hand_computed():
    values = t([1.0, 2.0, 3.0], [4.0, 0.0, 0.0])
    mask = t([1, 1, 1], [1, 0, 0])
    assert aggregate(values, mask, "token-mean", loss_normaliser("token-mean", 4, 2)).item() == pytest.approx(10 / 4)
    # seq-mean: (mean(1,2,3) + mean(4)) / 2 = (2 + 4)/2
    assert aggregate(values, mask, "seq-mean", loss_normaliser("seq-mean", 4, 2)).item() == pytest.approx(3.0)
    # Dr. GRPO: 10 / (2 · 5)
    assert aggregate(values, mask, "dr-grpo", loss_normaliser("dr-grpo", 4, 2, max_len=5)).item() == 1.0
    with pytest.raises(ValueError):
        loss_normaliser("dr-grpo", 4, 2)
    assert loss_normaliser("token-mean", 0, 0) == 1.0


def test_seq_mean_with_packed_segments():
    values = t([1.0, 3.0, 10.0, 0.0])
    mask = t([1, 1, 1, 0])
    segments = torch.tensor([[0, 0, 1, -1]])
    # sequences: mean(1,3)=2 and 10 → (2 + 10)/2
    assert aggregate(values, mask, "seq-mean", 2.0, segments).item() == pytest.approx(6.0)


def test_policy_loss_metrics():
    old = t([0.0, 0.0, 0.0])
    logp = t([math.log(1.5), 0.0, 0.0])
    loss, m = policy_loss(logp, old, t(1.0), t([1, 1, 0]), normaliser=2.0)
    assert loss.item() == pytest.approx((-1.2 - 1.0) / 2)
    assert m["clip_fraction"] == 0.5 and m["num_tokens"] == 2.0
    # approx_kl (k3) on token 1: 1.5 − 1 − ln 1.5, token 2: 0 → mean over 2
    assert m["approx_kl"] == pytest.approx((0.5 - math.log(1.5)) / 2)
    weighted, _ = policy_loss(logp, old, t(1.0), t([1, 1, 0]), normaliser=2.0, is_weights=t([0.5, 2.0, 1.0]))
    assert weighted.item() == pytest.approx((-0.6 - 2.0) / 2)


def _batch(seed, rows, width):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).double()
    old = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 3
    new = (old + (torch.rand(rows, width, generator=g, dtype=torch.float64) - 0.5)).detach()
    adv = torch.randn(rows, generator=g, dtype=torch.float64)
    return new, old, adv, mask


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["token-mean", "seq-mean", "dr-grpo"]), st.sampled_from([None, 3.0]))
def test_loss_invariant_to_micro_batch_split(seed, mode, dual):
    new, old, adv, mask = _batch(seed, rows=8, width=7)
    norm = loss_normaliser(mode, int(mask.sum()), int((mask.sum(-1) > 0).sum()), max_len=7)
    cfg = ClipConfig(0.2, 0.28, dual)
    grads = []
    for parts in (1, 2, 4):
        leaf = new.clone().requires_grad_(True)
        total = 0.0
        for idx in torch.arange(8).chunk(parts):
            loss, _ = policy_loss(leaf[idx], old[idx], adv[idx], mask[idx], normaliser=norm, mode=mode, cfg=cfg)
            loss.backward()
            total += loss.item()
        grads.append((total, leaf.grad.clone()))
    for total, grad in grads[1:]:
        assert total == pytest.approx(grads[0][0], rel=1e-10, abs=1e-12)
        torch.testing.assert_close(grad, grads[0][1], rtol=1e-10, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-20, 0, allow_nan=False), min_size=1, max_size=8),
    st.floats(-5, 5, allow_nan=False),
    st.floats(0.01, 0.5),
    st.floats(0.01, 0.5),
    st.sampled_from([None, 2.0, 3.0]),
)
def test_clip_inactive_when_ratio_is_one_property(logps, adv, low, high, dual):
    logp = torch.tensor([logps], dtype=torch.float64, requires_grad=True)
    loss, info = ppo_token_loss(
        logp, logp.detach().clone(), torch.tensor([adv], dtype=torch.float64), ClipConfig(low, high, dual)
    )
    assert not info["clipped"].any()
    loss.sum().backward()
    # d/dlogp of −A·r at r = 1 is −A on every token: the unclipped policy gradient
    torch.testing.assert_close(logp.grad, torch.full_like(logp, -adv))
