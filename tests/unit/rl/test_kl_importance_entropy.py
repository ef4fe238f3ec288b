"""KL estimators, importance weights and the entropy estimator against hand-computed numbers."""

import math

import pytest
import torch

from services.trainer.logprobs import categorical_entropy
from services.trainer.rl.loss import effective_sample_size, importance_weights, kl_estimate, kl_loss, mismatch_metrics


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def close(actual, expected):
    torch.testing.assert_close(actual.double(), torch.tensor(expected, dtype=torch.float64))


def test_kl_estimators_hand_computed():
    logp, ref = t([-1.0]), t([-1.5])  # δ = logp − ref = 0.5
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(0.5)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.125)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    assert kl_estimate(logp, logp, "k3").item() == 0.0
    with pytest.raises(ValueError):
        kl_estimate(logp, ref, "k4")  # type: ignore[arg-type]


def test_k3_clamped_like_verl():
    # ref − logp = 30 → clamped to 20 → e^20 − 21 → result clamped to 10
    assert kl_estimate(t([-30.0]), t([0.0]), "k3").item() == 10.0
    # ref − logp = −1000 → clamped to −20 → e^−20 + 20 − 1 = 19 → clamped to 10
    assert kl_estimate(t([0.0]), t([-1000.0]), "k3").item() == 10.0


def test_kl_loss_aggregates_with_mask():
    loss, m = kl_loss(t([-1.0, -1.0]), t([-1.5, -1.0]), t([1, 1]), normaliser=2.0, kind="k1")
    assert loss.item() == pytest.approx(0.25) and m["kl"] == pytest.approx(0.25)


def test_token_tis_truncates_at_cap():
    logp = t([math.log(3.0), math.log(0.5), 0.0])
    w, m = importance_weights(logp, t([0.0, 0.0, 0.0]), t([1, 1, 0]), mode="token", cap=2.0)
    assert w[0].tolist() == pytest.approx([2.0, 0.5, 0.0])
    assert m["is_token_truncated_fraction"] == 0.5
    assert m["is_weight_mean"] == pytest.approx(1.25)
    # ESS of (2, 0.5): 2.5² / (2 · 4.25)
    assert m["is_ess"] == pytest.approx(6.25 / 8.5)


def test_sequence_mask_outside_bounds():
    # row 0: log w = (ln 3, 0) → geo mean ratio √3 (inside [0.5, 2]); row 1: ln 9 → ratio 9 (masked)
    logp = t([math.log(3.0), 0.0], [math.log(9.0), 0.0])
    w, m = importance_weights(logp, torch.zeros_like(logp), t([1, 1], [1, 0]), mode="sequence")
    close(w, [[3.0, 1.0], [0.0, 0.0]])
    assert m["is_seq_masked_fraction"] == 0.5
    prod, _ = importance_weights(
        logp, torch.zeros_like(logp), t([1, 1], [1, 0]), mode="sequence", seq_agg="product", seq_max=5.0
    )
    close(prod, [[3.0, 1.0], [0.0, 0.0]])  # product 3 inside, 9 outside


def test_token_and_sequence_combined_and_none():
    logp = t([math.log(4.0), 0.0])
    w, _ = importance_weights(logp, torch.zeros_like(logp), t([1, 1]), mode="token+sequence", cap=3.0)
    close(w, [[3.0, 1.0]])
    none, m = importance_weights(logp, torch.zeros_like(logp), t([1, 0]), mode="none")
    assert none.tolist() == [[1.0, 0.0]] and m["is_ess"] == 1.0


def test_packed_sequences_masked_independently():
    logp = t([math.log(9.0), 0.0, 0.0])
    seg = torch.tensor([[0, 1, 1]])
    w, _ = importance_weights(logp, torch.zeros_like(logp), t([1, 1, 1]), mode="sequence", segment_ids=seg)
    assert w.tolist() == [[0.0, 1.0, 1.0]]


def test_mismatch_metrics():
    logp = t([math.log(2.0), 0.0])
    m = mismatch_metrics(logp, torch.zeros_like(logp), t([1, 1]))
    assert m["mismatch_kl_k1"] == pytest.approx(-math.log(2.0) / 2)
    assert m["mismatch_kl_k3"] == pytest.approx((1 - math.log(2.0)) / 2)
    assert effective_sample_size(t([1.0, 1.0]), t([1, 1])) == 1.0


def test_entropy_estimator():
    uniform = torch.log_softmax(torch.zeros(1, 2, 4), -1)
    close(categorical_entropy(uniform), [[math.log(4)] * 2])
    # logits (2, 0, −1): Z = e² + 1 + e⁻¹ = 8.75694; H = ln Z − Σ p·z = 2.16985 − (2·0.84380 − 1·0.04201)
    logp = torch.log_softmax(torch.tensor([[2.0, 0.0, -1.0]]), -1)
    assert categorical_entropy(logp).item() == pytest.approx(0.5242666, rel=1e-6)
    assert categorical_entropy(logp.bfloat16()).dtype == torch.float32  # the sum over the vocabulary in fp32


def test_entropy_of_an_underflowing_probability_is_finite():
    # p of the second token is e^−200: 0 in float32, so p·log p computed from p would be 0·(−inf) = NaN.
    logits = torch.tensor([[0.0, -200.0]])
    p = torch.softmax(logits, -1)
    assert torch.isnan(-(p * p.log()).sum())
    assert categorical_entropy(torch.log_softmax(logits, -1)).item() == pytest.approx(0.0, abs=1e-12)
