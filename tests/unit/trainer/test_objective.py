"""The trainer's glue around rl_loss: bypass vs decoupled IS, world scaling, metric averaging."""

from __future__ import annotations

import pytest
import torch

from services.trainer.config import TrainerSettings
from services.trainer.metrics import RlMetrics
from services.trainer.packing import TrainSeq, pack
from services.trainer.step import Objective, RlSums


def _batch(adv: float = 1.0, old: float = -1.0):
    seqs = [
        TrainSeq(
            [5, 6, 7, 8],
            [0, 1, 1, 1],
            {"old_logp": [0.0, old, old, old], "adv": [adv] * 4, "staleness": [0.0, 1.0, 1.0, 1.0]},
            0,
        )
    ]
    return pack(seqs, 16)[0]


def test_bypass_ratio_against_sampler_and_gradient_sign():
    b = _batch(adv=1.0, old=-1.0)
    logp = torch.full(b.input_ids.shape, -1.0, requires_grad=True)
    loss, m = Objective(TrainerSettings())(logp, torch.zeros_like(logp), b, {"tokens": 3, "sequences": 1, "world": 2})
    assert loss.item() == pytest.approx(-2.0)  # −A·r token-mean = −1, times world 2
    loss.backward()
    assert (logp.grad[b.target_mask > 0] < 0).all()  # descending raises the logprob of a positive-advantage token
    assert (logp.grad[b.target_mask == 0] == 0).all()  # untrained positions get no gradient
    out = m.means()  # one micro-batch: its local means are the step's
    assert m.tokens == 3 and out.ratio_mean == pytest.approx(1.0) and out.staleness_mean == pytest.approx(1.0)
    assert out.mismatch_kl_k3 == pytest.approx(0.0) and out.is_weight_mean is None  # no IS in bypass mode


def test_decoupled_mode_weights_by_sampler_ratio():
    b = _batch(adv=1.0, old=-2.0)  # the sampler gave these tokens e^-2; the policy now e^-1: w = e, capped at 2
    logp = torch.full(b.input_ids.shape, -1.0, requires_grad=True)
    loss, m = Objective(TrainerSettings(importance={"mode": "token", "cap": 2.0}))(
        logp, torch.zeros_like(logp), b, {"tokens": 3, "sequences": 1, "world": 1}
    )
    assert loss.item() == pytest.approx(-2.0)  # −A · w(=2) · r(=1)
    assert m.means().is_weight_mean == pytest.approx(2.0)


def test_rl_sums_average_means_by_tokens_and_add_shares():
    metrics = RlSums.of(RlMetrics(clip_fraction=1.0, pg_loss=0.5), 1.0)
    metrics += RlSums.of(RlMetrics(clip_fraction=0.0, pg_loss=0.25), 3.0)
    assert metrics == RlSums(RlMetrics(pg_loss=0.75, clip_fraction=1.0), tokens=4.0)
    # clip_fraction (1·1 + 0·3) / 4, not the mean of the micro-batch means (0.5); pg_loss: the shares' sum
    assert metrics.means() == RlMetrics(clip_fraction=0.25, pg_loss=0.75)
