"""RED weights: hand-computed values and one test per defect of upstream RED (``docs/upstream.md``)."""

import json

import pytest

from services.trainer.rl.red import (
    REDConfig,
    REDState,
    REDWeights,
    accuracy_factor,
    entropy_change_weight,
    planner_accuracy,
    red_weights,
)


def test_entropy_change_weight_relative_and_absolute():
    # relative: |1 − 1.1/1.0| / |1 − 2.02/2.0| = 0.1 / 0.01 = 10 → clamped to G = 5
    assert entropy_change_weight(1.0, 1.1, 2.0, 2.02, g=5.0, eps=0.0) == pytest.approx(5.0)
    # relative 0.03 / 0.01 = 3
    assert entropy_change_weight(1.0, 1.03, 2.0, 2.02, g=5.0, eps=0.0) == pytest.approx(3.0)
    # absolute: |1.03 − 1.0| / |2.02 − 2.0| = 1.5
    assert entropy_change_weight(1.0, 1.03, 2.0, 2.02, g=5.0, delta="absolute", eps=0.0) == pytest.approx(1.5)
    # SFT changes less than RL → floor of w_ent is 1
    assert entropy_change_weight(1.0, 1.0, 2.0, 3.0, g=5.0) == 1.0


def test_accuracy_factor():
    assert accuracy_factor(0.0, 5.0) == pytest.approx(5.0)
    assert accuracy_factor(0.5, 5.0) == pytest.approx(1.0)
    assert accuracy_factor(1.0, 5.0) == pytest.approx(0.2)
    assert accuracy_factor(0.25, 4.0) == pytest.approx(2.0)  # 4^(0.5)


def test_red_accuracy_excludes_executor_rows():
    scores = [1.0, 0.0, 0.0, 0.0, 0.0]  # planner p1 right; p2 wrong; 3 executors scored 0 vs the question gold
    roles = ["planner", "planner", "executor", "executor", "executor"]
    assert planner_accuracy(scores, roles) == 0.5  # upstream counted all rows: 1/5
    assert planner_accuracy([0.3, 0.0], ["policy", "policy"], threshold=0.5) == 0.0
    assert planner_accuracy([1.0], ["executor"]) is None


def test_red_emas_seeded_from_first_measurement():
    state = REDState()
    state.observe(h_rl=2.0, h_sft=0.7, decay=0.99)
    assert (state.h_rl, state.h_rl_prev, state.h_sft, state.h_sft_prev) == (2.0, 2.0, 0.7, 0.7)
    state.observe(h_rl=2.2, h_sft=0.8, decay=0.99)
    assert state.h_rl == pytest.approx(0.99 * 2.0 + 0.01 * 2.2) and state.h_rl_prev == 2.0
    assert state.h_sft == pytest.approx(0.99 * 0.7 + 0.01 * 0.8) and state.h_sft_prev == 0.7
    # Started at 1.0 (as upstream did), the first update would have moved the EMA toward 2.0 instead.


def test_red_first_steps_weight_is_neutral():
    cfg = REDConfig(accuracy_aware=False)
    state = REDState()
    assert red_weights(state, cfg, None, 0.1).entropy_weight == 1.0  # nothing measured yet
    state.observe(2.0, 0.7, cfg.ema_decay)
    assert red_weights(state, cfg, None, 0.1).entropy_weight == 1.0  # seeded: both deltas 0


def test_red_full_weight_hand_computed():
    cfg = REDConfig(g=5.0, ema_decay=0.0)  # decay 0: EMA = latest measurement
    state = REDState()
    state.observe(2.0, 1.0, cfg.ema_decay)
    state.observe(2.02, 1.03, cfg.ema_decay)  # relative deltas: rl 0.01, sft 0.03 → w_ent 3
    w = red_weights(state, cfg, accuracy=0.25, sft_coef=0.1, eps=0.0)  # a = 5^(0.5) = 2.236 → 6.708
    assert w == REDWeights(
        entropy_weight=pytest.approx(3.0),
        accuracy_factor=pytest.approx(5**0.5),
        final_weight=pytest.approx(3.0 * 5**0.5),
        sft_loss_weight=pytest.approx(0.1 * 3.0 * 5**0.5),
        batch_accuracy=0.25,
        h_rl=2.02,  # the EMAs the weights were computed from
        h_rl_prev=2.0,
        h_sft=1.03,
        h_sft_prev=1.0,
    )


def test_red_final_floor_configurable_default_below_one():
    # Upstream floored the final weight at 1, so high accuracy could never reduce SFT below sft_coef.
    state = REDState()
    w = red_weights(state, REDConfig(g=5.0), accuracy=1.0, sft_coef=0.1)
    assert w.final_weight == pytest.approx(0.2)  # w_ent 1 · 1/G, above the default floor 1/G² = 0.04
    floored = red_weights(state, REDConfig(g=5.0, floor=1.0), accuracy=1.0, sft_coef=0.1)
    assert floored.final_weight == 1.0
    assert REDConfig(g=5.0).weight_floor == pytest.approx(0.04)
    high = red_weights(state, REDConfig(g=2.0), accuracy=0.0, sft_coef=0.1)
    assert high.final_weight == pytest.approx(2.0)


def test_red_ablation_switches():
    state = REDState()
    state.observe(2.0, 1.0, 0.0)
    state.observe(2.02, 1.03, 0.0)
    assert red_weights(state, REDConfig(mode="grpo_only"), 0.0, 0.1).sft_loss_weight == 0.0
    fixed = red_weights(state, REDConfig(mode="fixed"), 0.0, sft_coef=0.1)
    assert fixed.sft_loss_weight == pytest.approx(0.1) and fixed.final_weight == 1.0
    full = red_weights(state, REDConfig(mode="red"), 0.0, sft_coef=0.1, eps=0.0)
    assert full.sft_loss_weight > 0.1


def test_red_state_round_trips_through_json():
    state = REDState()
    state.observe(2.0, 1.0, 0.99)
    restored = REDState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state


def test_red_state_reads_checkpoints_that_kept_the_last_weights():
    # Before REDWeights the state also stored the last weights (``last``), which nothing read back.
    state = REDState(2.0, 2.0, 1.0, 1.0, steps=1)
    assert REDState.from_dict({**state.to_dict(), "last": {"red/final_weight": 1.0}}) == state


def test_red_weights_leave_the_state_alone():
    state = REDState()
    state.observe(2.0, 1.0, 0.99)
    before = state.to_dict()
    red_weights(state, REDConfig(), 0.5, 0.1)
    assert state.to_dict() == before


def test_red_config_validation():
    with pytest.raises(ValueError):
        REDConfig(g=0.5)
    with pytest.raises(ValueError):
        REDConfig(ema_decay=1.0)
