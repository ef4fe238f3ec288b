"""Reward combination per prompt group: hand-computed schemes, zero-std safety, PCA sign anchoring."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from agents.rewards.combine import combine_rewards, consistency_mask

COMPONENTS = {"mrr": [1.0, 0.0, 0.5], "sim": [0.2, 0.4, 0.6]}


def test_explicit_and_uniform():
    r = combine_rewards(COMPONENTS, "explicit", {"mrr": 2.0, "sim": 0.0})
    assert r.rewards.tolist() == pytest.approx([2.0, 0.0, 1.0])
    u = combine_rewards(COMPONENTS, "uniform")
    assert u.rewards.tolist() == pytest.approx([0.6, 0.2, 0.55]) and u.weights == {"mrr": 0.5, "sim": 0.5}
    with pytest.raises(ValueError):
        combine_rewards(COMPONENTS, "explicit", {"nope": 1.0})


def test_std_weighted_hand_computed():
    # population std: mrr = sqrt(((0.5)²+(0.5)²+0)/3) = 0.4082, sim = sqrt((0.04+0+0.04)/3) = 0.1633
    r = combine_rewards(COMPONENTS, "std")
    sd_m, sd_s = np.sqrt(0.5 / 3), np.sqrt(0.08 / 3)
    wm, ws = sd_m / (sd_m + sd_s), sd_s / (sd_m + sd_s)
    assert r.weights["mrr"] == pytest.approx(wm)
    assert r.rewards.tolist() == pytest.approx([wm * 1 + ws * 0.2, ws * 0.4, wm * 0.5 + ws * 0.6])


def test_std_weighting_all_zero_std_no_nan():
    r = combine_rewards({"a": [1.0, 1.0], "b": [0.0, 0.0]}, "std")
    assert np.all(np.isfinite(r.rewards)) and r.rewards.tolist() == [0.5, 0.5]
    assert r.weights == {"a": 0.5, "b": 0.5}


def test_l2():
    r = combine_rewards({"a": [3.0, 0.0], "b": [4.0, 1.0]}, "l2")
    assert r.rewards.tolist() == [5.0, 1.0] and r.weights == {"a": 1.0, "b": 1.0}


def test_pca_hand_computed_two_perfectly_correlated_components():
    # a and b both z-score to (−1, 1): PC1 = (1, 1)/√2, projection = ±√2, sign: follows a + b
    r = combine_rewards({"a": [0.0, 1.0], "b": [0.0, 2.0]}, "pca")
    assert r.rewards.tolist() == pytest.approx([-np.sqrt(2), np.sqrt(2)], rel=1e-6)
    assert r.weights["a"] == pytest.approx(2**-0.5, rel=1e-6)


def test_pca_degenerate_group():
    r = combine_rewards({"a": [1.0, 1.0, 1.0], "b": [2.0, 2.0, 2.0]}, "pca")
    assert r.rewards.tolist() == [0.0, 0.0, 0.0]
    assert np.all(np.isfinite(list(r.weights.values())))


def test_unknown_scheme_and_bad_shapes():
    with pytest.raises(ValueError):
        combine_rewards(COMPONENTS, "median")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        combine_rewards({"a": [1.0], "b": [1.0, 2.0]})
    with pytest.raises(ValueError):
        combine_rewards({})


def test_consistency_mask():
    mask = consistency_mask({"a": [1.0, 0.0, 0.5], "b": [1.0, 0.0, 0.0]})
    # means a 0.5, b 1/3: row0 (+,+) keep; row1 (−,−) keep; row2 (0, −) keep (tie counts as both)
    assert mask.tolist() == [True, True, True]
    assert consistency_mask({"a": [1.0, 0.0], "b": [0.0, 1.0]}).tolist() == [False, False]


@settings(max_examples=60, deadline=None)
@given(
    arrays(
        np.float64,
        st.tuples(st.integers(2, 8), st.integers(1, 4)),
        elements=st.floats(-5, 5, allow_nan=False, allow_infinity=False),
    )
)
def test_pca_sign_anchored(matrix):
    components = {f"c{k}": matrix[:, k] for k in range(matrix.shape[1])}
    r = combine_rewards(components, "pca")
    anchor = matrix.sum(axis=1)
    assert np.all(np.isfinite(r.rewards))
    corr = np.dot(r.rewards - r.rewards.mean(), anchor - anchor.mean())
    assert corr >= -1e-9 * max(1.0, np.abs(anchor).sum() * np.abs(r.rewards).sum())
