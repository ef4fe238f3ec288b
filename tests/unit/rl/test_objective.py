"""The composed RL objective: terms hand-checked, and split invariance with packed rows and uneven splits."""

import math

import pytest
import torch

from services.trainer.config import ImportanceSampling
from services.trainer.rl.loss import ClipConfig, LossConfig, LossInputs, loss_normaliser, rl_loss


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_objective_terms_hand_computed():
    logp = t([math.log(0.5), math.log(0.5)])
    batch = LossInputs(
        logp=logp,
        old_logp=logp.clone(),
        advantages=t(1.0),
        mask=t([1, 1]),
        ref_logp=t([math.log(0.25), math.log(0.5)]),
        entropy=t([1.0, 3.0]),
    )
    cfg = LossConfig(kl_coef=0.1, kl_estimator="k1", entropy_coef=0.01)
    loss, m = rl_loss(batch, cfg, normaliser=2.0)
    # pg: ratio 1 → −A = −1 per token → −1; k1: (ln .5 − ln .25 + 0)/2 = ln2/2; entropy mean 2
    assert loss.item() == pytest.approx(-1.0 + 0.1 * math.log(2) / 2 - 0.01 * 2.0)
    assert m["kl"] == pytest.approx(math.log(2) / 2)


def test_kl_off_by_default_needs_no_reference():
    logp = t([-1.0])
    loss, m = rl_loss(LossInputs(logp, logp.clone(), t(1.0), t([1])), LossConfig(), normaliser=1.0)
    assert loss.item() == pytest.approx(-1.0) and "kl" not in m
    with pytest.raises(ValueError, match="ref_logp"):
        rl_loss(LossInputs(logp, logp.clone(), t(1.0), t([1])), LossConfig(kl_coef=0.001), 1.0)
    with pytest.raises(ValueError, match="sampler"):
        rl_loss(
            LossInputs(logp, logp.clone(), t(1.0), t([1])), LossConfig(importance=ImportanceSampling(mode="token")), 1.0
        )


def test_importance_weights_enter_the_loss():
    logp = t([0.0, 0.0])
    batch = LossInputs(
        logp=logp, old_logp=logp.clone(), advantages=t(1.0), mask=t([1, 1]), sampler_logp=t([math.log(0.25), 0.0])
    )  # w = (4 → capped 2, 1)
    loss, m = rl_loss(batch, LossConfig(importance=ImportanceSampling(mode="token", cap=2.0)), normaliser=2.0)
    assert loss.item() == pytest.approx(-(2.0 + 1.0) / 2)
    assert m["is_token_truncated_fraction"] == 0.5


def _packed(seed):
    """6 rows × 8 tokens, each row packing two sequences (segment ids unique per row pair), some padding."""
    g = torch.Generator().manual_seed(seed)
    rows, width = 6, 8
    cut = torch.randint(1, width - 1, (rows,), generator=g)
    end = torch.randint(0, 2, (rows,), generator=g)  # 0 or 1 padding tokens at the end
    pos = torch.arange(width).unsqueeze(0)
    seg = torch.where(
        pos < cut.unsqueeze(1), 2 * torch.arange(rows).unsqueeze(1), 2 * torch.arange(rows).unsqueeze(1) + 1
    )
    seg = torch.where(pos >= width - end.unsqueeze(1), torch.full_like(seg, -1), seg)
    mask = (seg >= 0).double() * (torch.rand(rows, width, generator=g) > 0.2).double()
    old = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 2
    new = old + (torch.rand(rows, width, generator=g, dtype=torch.float64) - 0.5) * 0.8
    adv = torch.randn(rows, width, generator=g, dtype=torch.float64)
    adv = adv.gather(1, seg.clamp(min=0) % width)  # any per-token advantages will do for invariance
    sampler = old + (torch.rand(rows, width, generator=g, dtype=torch.float64) - 0.5) * 0.4
    ref = old - 0.1
    ent = torch.rand(rows, width, generator=g, dtype=torch.float64)
    return new, old, adv, mask, seg, sampler, ref, ent


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean", "dr-grpo"])
def test_dynamic_micro_batch_sizes_do_not_rescale_gradient(agg):
    # Upstream CoDA's bug: dynamic batching changed the number of micro-batches but the loss was still divided by
    # a fixed accumulation count. Here uneven splits (6 | 1+5 | 2+1+3 | 1×6) give the same gradient.
    new, old, adv, mask, seg, sampler, ref, ent = _packed(7)
    sequences = int(torch.unique(seg[(mask > 0) & (seg >= 0)]).numel())
    norm = loss_normaliser(agg, int(mask.sum()), sequences, max_len=8)
    cfg = LossConfig(
        clip=ClipConfig(0.2, 0.28, 3.0),
        agg=agg,
        kl_coef=0.01,
        entropy_coef=0.001,
        importance=ImportanceSampling(mode="token+sequence", seq_min=0.8, seq_max=1.25),
    )
    results = []
    for splits in ([6], [1, 5], [2, 1, 3], [1] * 6):
        leaf = new.clone().requires_grad_(True)
        total, start = 0.0, 0
        for size in splits:
            idx = slice(start, start + size)
            start += size
            batch = LossInputs(
                leaf[idx],
                old[idx],
                adv[idx],
                mask[idx],
                ref_logp=ref[idx],
                sampler_logp=sampler[idx],
                entropy=ent[idx],
                segment_ids=seg[idx],
            )
            loss, _ = rl_loss(batch, cfg, norm)
            loss.backward()
            total += loss.item()
        results.append((total, leaf.grad.clone()))
    for total, grad in results[1:]:
        assert total == pytest.approx(results[0][0], rel=1e-10, abs=1e-12)
        torch.testing.assert_close(grad, results[0][1], rtol=1e-10, atol=1e-12)
