"""The learning-rate multiplier against values worked out by hand."""

from __future__ import annotations

import pytest

from services.trainer.step import lr_multiplier


def test_warmup_then_constant():
    assert [lr_multiplier(s, warmup=4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_linear_decay_to_the_floor():
    # warm-up 10, total 110: p = (step − 10) / 100; m = 0.1 → 0.1 + 0.9·(1 − p)
    kw = dict(warmup=10, total=110, schedule="linear", min_ratio=0.1)
    assert lr_multiplier(9, **kw) == 1.0  # last warm-up step
    assert lr_multiplier(10, **kw) == pytest.approx(1.0)
    assert lr_multiplier(60, **kw) == pytest.approx(0.55)
    assert lr_multiplier(110, **kw) == pytest.approx(0.1)
    assert lr_multiplier(500, **kw) == pytest.approx(0.1)  # past the budget: stays at the floor


def test_cosine_decay():
    # no warm-up, total 100, m = 0: (1 + cos(π·p)) / 2 → 1, 0.5 at p = 0.5, (1 + cos(3π/4))/2 = 0.1464… at 0.75
    kw = dict(total=100, schedule="cosine")
    assert lr_multiplier(0, **kw) == 1.0
    assert lr_multiplier(50, **kw) == pytest.approx(0.5)
    assert lr_multiplier(75, **kw) == pytest.approx(0.14644660940672627)
    assert lr_multiplier(100, **kw) == pytest.approx(0.0)


def test_decay_over_the_last_steps_only():
    # warm-up 10, total 500, decay over the last 150: constant to step 350, then linear to 0.2 at 500
    kw = dict(warmup=10, total=500, schedule="linear", min_ratio=0.2, decay_steps=150)
    assert lr_multiplier(200, **kw) == 1.0 and lr_multiplier(350, **kw) == 1.0
    assert lr_multiplier(425, **kw) == pytest.approx(0.6)
    assert lr_multiplier(500, **kw) == pytest.approx(0.2)
    # a decay longer than the budget after warm-up starts at the warm-up's end
    assert lr_multiplier(10, warmup=10, total=20, schedule="linear", decay_steps=100) == 1.0
    assert lr_multiplier(15, warmup=10, total=20, schedule="linear", decay_steps=100) == pytest.approx(0.5)


def test_no_budget_means_no_decay_and_unknown_schedules_fail():
    assert lr_multiplier(10_000, warmup=10, total=0, schedule="cosine") == 1.0
    with pytest.raises(ValueError, match="unknown learning-rate schedule"):
        lr_multiplier(5, total=10, schedule="step")  # type: ignore[arg-type]
