"""Each rule's ``make train`` check on hand-made step records and scrapes: it fires on the failure it names and
stays quiet on a healthy run's numbers."""

from __future__ import annotations

import math

import pytest

from launcher.alerts import checks
from launcher.alerts.observed import Observed, Scrape
from launcher.alerts.rules import RULES
from launcher.alerts.settings import AlertSettings

S = AlertSettings.model_construct()  # the defaults, whatever the environment says
T0 = 1_000_000.0


def healthy_step(step: int, **over) -> dict:
    """A step of a run that learns: a step every 2 s, rewards that vary, nothing clipped or stale."""
    rec = {
        "step": step,
        "time": T0 + 2 * step,
        "step_seconds": 2.0,
        "loss": 0.1,
        "grad_norm": 0.5,
        "rl_entropy": 2.0 - 0.01 * step,
        "reward_mean": 0.2 + 0.005 * step,
        "groups": 2,
        "zero_variance_groups": step % 2,
        "rl_sequences": 8,
        "dropped_stale_step": 0,
        "skipped_zero_advantage": 0,
        "mismatch_kl_k3": 1e-4,
        "is_weight_mean": 1.0,
        "clip_fraction": 0.02,
        "queue_lag": 0,
    }
    return rec | over


def run(n: int = 60, **over) -> list[dict]:
    return [healthy_step(i, **over) for i in range(1, n + 1)]


def observed(records: list[dict], now: float | None = None, scrapes: list[Scrape] | None = None) -> Observed:
    now = records[-1]["time"] + 1 if now is None and records else (now or T0)
    return Observed(records=records, scrapes=scrapes or [], now=now, started=T0)


def scrape(t: float, published: float, up: dict[str, float], served: dict[str, float], live: float) -> Scrape:
    return Scrape(
        t,
        {
            "coda_rollout_groups_total": {(("outcome", "published"),): published},
            "coda_rollout_server_up": {(("server", u),): v for u, v in up.items()},
            "coda_rollout_server_version": {(("server", u),): v for u, v in served.items()},
            "coda_policy_version": {(("service", "rollout"),): live},
        },
    )


def healthy_scrapes(n: int = 100) -> list[Scrape]:
    """A scrape every 10 s: a group published each time, two servers up and current."""
    return [scrape(T0 + 10 * i, i, {"a": 1, "b": 1}, {"a": i, "b": i}, i) for i in range(n)]


def test_a_healthy_run_fires_nothing():
    records, scrapes = run(), healthy_scrapes(13)  # 120 s of steps and of scrapes
    o = Observed(records, scrapes, now=records[-1]["time"] + 1, started=T0)
    assert {rule.name: rule.check(o, S) for rule in RULES} == {rule.name: None for rule in RULES}


def test_every_rule_has_its_check_here():
    tested = {name.removeprefix("test_").split("_fires")[0] for name in globals() if "_fires" in name}
    assert {rule.check.__name__ for rule in RULES} <= tested


def test_trainer_stalled_fires_after_k_median_steps_and_the_floor():
    records = run(20)
    last = records[-1]["time"]
    assert checks.trainer_stalled(observed(records, now=last + 299), S) is None  # 5 × 2 s < the 300 s floor
    assert "no step for 301s" in checks.trainer_stalled(observed(records, now=last + 301), S)
    slow = run(20, step_seconds=100.0)
    assert checks.trainer_stalled(observed(slow, now=last + 450), S) is None  # 5 × 100 s = 500 s
    assert checks.trainer_stalled(observed(slow, now=last + 501), S)


def test_trainer_stalled_fires_not_before_a_resumed_runs_first_step():
    old = run(5)
    o = Observed(old, [], now=T0 + 10_000, started=T0 + 9_900)  # resumed 100 s ago, old records hours before
    assert checks.trainer_stalled(o, S) is None
    assert checks.trainer_stalled(observed([], now=T0 + 10_000), S) is None  # no step yet


def test_rollout_stalled_fires_when_nothing_is_published_and_the_queue_is_empty():
    scrapes = [scrape(T0 + 10 * i, min(i, 10), {"a": 1}, {"a": 1}, 1) for i in range(80)]  # stuck after 100 s
    now = scrapes[-1].time
    records = run(5)
    assert "no group published for 690s" in checks.rollout_stalled(observed(records, now, scrapes), S)
    waiting = run(5, queue_lag=4)  # the trainer has groups to read: the rollout is held back, not broken
    assert checks.rollout_stalled(observed(waiting, now, scrapes), S) is None
    assert checks.rollout_stalled(observed(records, now, healthy_scrapes(80)), S) is None


def test_server_down_fires_after_server_down_s():
    scrapes = [scrape(T0 + 10 * i, i, {"a": 1, "b": 0 if i >= 20 else 1}, {"a": i, "b": 3}, i) for i in range(26)]
    assert checks.server_down(observed([], scrapes[-1].time, scrapes), S) is None  # down for 50 s
    later = [*scrapes, *[scrape(T0 + 10 * i, i, {"a": 1, "b": 0}, {"a": i, "b": 3}, i) for i in range(26, 30)]]
    assert checks.server_down(observed([], later[-1].time, later), S) == "down for over 60s: b"  # 90 s
    back = [*later, scrape(T0 + 300, 30, {"a": 1, "b": 1}, {"a": 30, "b": 30}, 30)]
    assert checks.server_down(observed([], back[-1].time, back), S) is None


def test_server_behind_fires_for_a_server_stuck_at_an_old_version():
    scrapes = [scrape(T0 + 10 * i, i, {"a": 1, "b": 1}, {"a": i, "b": min(i, 5)}, i) for i in range(40)]
    assert checks.server_behind(observed([], scrapes[-1].time, scrapes), S) == "2+ versions behind the live one: b"
    unprobed = [scrape(T0 + 10 * i, i, {"a": 1}, {"a": -1}, i) for i in range(40)]
    assert checks.server_behind(observed([], unprobed[-1].time, unprobed), S) is None


def test_stale_rollouts_fires_on_a_high_dropped_share():
    assert "50% of samples dropped" in checks.stale_rollouts(observed(run(20, dropped_stale_step=8)), S)
    assert checks.stale_rollouts(observed(run(20, dropped_stale_step=1)), S) is None  # 11%


def test_mismatch_spike_fires_on_kl_or_weights():
    sustained = [*run(20), *[healthy_step(i, mismatch_kl_k3=0.5) for i in range(21, 31)]]
    assert "mismatch KL 0.5 over the last 10 steps" in checks.mismatch_spike(observed(sustained), S)
    one_step = [*run(20), healthy_step(21, mismatch_kl_k3=0.96)]  # seen on a healthy tiny-cpu run
    assert checks.mismatch_spike(observed(one_step), S) is None
    stale = [healthy_step(i, mismatch_kl_k3=0.03 if i % 3 else 0.19) for i in range(1, 40)]  # tiny-cpu's
    assert checks.mismatch_spike(observed(stale), S) is None
    assert "importance weight 0.600" in checks.mismatch_spike(observed(run(3, is_weight_mean=0.6)), S)
    assert checks.mismatch_spike(observed(run(3, is_weight_mean=1.1, mismatch_kl_k3=0.01)), S) is None


def test_entropy_collapse_fires_below_a_fraction_of_the_peak_and_the_floor():
    collapsed = [*run(10), healthy_step(11, rl_entropy=0.05)]
    assert "entropy 0.050 nats" in checks.entropy_collapse(observed(collapsed), S)
    from_scratch = [healthy_step(1, rl_entropy=7.3), healthy_step(2, rl_entropy=0.5)]  # < 10%, above the floor
    assert checks.entropy_collapse(observed(from_scratch), S) is None
    # The same collapse on a solved task (smol-cpu's make train: reward 0.95, entropy 2% of its peak): quiet.
    solved = [*run(10), *(healthy_step(i, rl_entropy=0.05, reward_mean=0.95) for i in range(11, 11 + S.window_steps))]
    assert checks.entropy_collapse(observed(solved), S) is None


def test_reward_drop_fires_when_the_smoothed_reward_falls_from_its_peak():
    rewards = [0.02 * i for i in range(40)] + [0.1] * 20  # up to 0.78, then down to 0.1
    records = [healthy_step(i + 1, reward_mean=r) for i, r in enumerate(rewards)]
    assert "down from its peak" in checks.reward_drop(observed(records), S)
    noisy = [healthy_step(i + 1, reward_mean=0.5 + (0.05 if i % 2 else -0.05)) for i in range(60)]
    assert checks.reward_drop(observed(noisy), S) is None


def test_no_learning_signal_fires_after_n_steps_of_equal_rewards():
    assert S.no_signal_steps == 5 and S.no_signal_share == 0.9 and S.no_signal_solved_reward == 0.5
    flat = run(25, zero_variance_groups=2)
    assert "100% of groups had equal rewards" in checks.no_learning_signal(observed(flat), S)
    assert checks.no_learning_signal(observed(flat[:4]), S) is None  # fewer than no_signal_steps
    assert checks.no_learning_signal(observed(flat[:5]), S)
    mostly = run(25, zero_variance_groups=1)  # half the groups still teach
    assert checks.no_learning_signal(observed(mostly), S) is None
    # 9 of the last 10 groups equal: 90%, not above no_signal_share.
    nine = [*run(4, zero_variance_groups=2), healthy_step(5, zero_variance_groups=1)]
    assert checks.no_learning_signal(observed(nine), S) is None
    sft_steps = [*run(25, zero_variance_groups=2), *[healthy_step(26 + i, groups=0) for i in range(5)]]
    assert checks.no_learning_signal(observed(sft_steps), S)  # steps without groups do not dilute the share
    # RED co-training does not hide it: smol-cpu trains demonstrations on every RL step.
    with_demonstrations = run(25, zero_variance_groups=2, sft_tokens=1000)
    assert checks.no_learning_signal(observed(with_demonstrations), S)
    solved = run(25, zero_variance_groups=2, reward_mean=0.95)  # every group all 1: a solved task
    assert checks.no_learning_signal(observed(solved), S) is None


def test_no_learning_signal_reads_the_logged_share_weighted_by_groups():
    # signal_share as the trainer logs it: 1 of 4 groups with a signal, then 0 of 2: (3 + 2) / 6 equal = 83%.
    rows = [
        healthy_step(1, groups=4, zero_variance_groups=0, signal_share=0.25),  # the share wins over the counts
        *(healthy_step(i, groups=2, zero_variance_groups=0, signal_share=0.0) for i in range(2, 6)),
    ]
    # (3 + 4 × 2) equal of 4 + 4 × 2 = 12 groups: 11/12 = 92% > 90%.
    assert "92% of groups" in checks.no_learning_signal(observed(rows), S)
    assert checks.signal_share(healthy_step(1, groups=4, zero_variance_groups=3)) == 0.25  # an older log


# ---------------------------------------------------------------- the default run, broken and healthy
# No train.jsonl of a real run is kept under tests/fixtures: the series below follow the numbers for a
# smol-cpu run at lr 2e-2, and docs/make-train.md's healthy run (warm start of 10 steps, then 15 RL steps of
# 2 groups × 4 samples, training reward 0.25 over the first 5 and 0.925 over the last 5, sft_loss ~0.03).
def warm_step(step: int, sft_loss: float, grad_norm: float = 1.0) -> dict:
    """An SFT-only step of the warm start: no groups, demonstrations only (as step_record writes it)."""
    return {
        "step": step,
        "time": T0 + 8 * step,
        "step_seconds": 8.0,
        "loss": sft_loss,
        "sft_loss": sft_loss,
        "sft_tokens": 600,
        "grad_norm": grad_norm,
        "groups": 0,
    }


def rl_step(step: int, reward: float, zero_variance: int, sft_loss: float, grad_norm: float) -> dict:
    return healthy_step(
        step,
        time=T0 + 80 + 32 * (step - 10),
        step_seconds=32.0,
        reward_mean=reward,
        groups=2,
        zero_variance_groups=zero_variance,
        signal_share=1 - zero_variance / 2,
        sft_loss=sft_loss,
        sft_tokens=600,
        grad_norm=grad_norm,
    )


LR100_SFT = [12.9 + (33.4 - 12.9) * i / 9 for i in range(10)]  # 12.9, 15.18, ..., 33.4: rising every step
LR100 = [
    *(warm_step(i + 1, loss, grad_norm=20.0) for i, loss in enumerate(LR100_SFT)),
    *(rl_step(11 + i, 0.0, 2, 30.0, [20, 170, 45, 90, 60][i % 5]) for i in range(15)),
]
HEALTHY_REWARD = [0.2, 0.25, 0.25, 0.3, 0.25, 0.4, 0.5, 0.6, 0.7, 0.8, 0.875, 0.9, 0.95, 0.95, 0.95]
HEALTHY_ZERO = [1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 2, 2, 2, 2, 2]  # late: groups all 1 (solved prompts)
HEALTHY = [
    *(warm_step(i + 1, 2.8 * 0.7**i) for i in range(10)),  # 2.8 falling to 0.11
    *(
        rl_step(11 + i, r, z, 0.03 + 0.01 * (i % 3), 0.5)
        for i, (r, z) in enumerate(zip(HEALTHY_REWARD, HEALTHY_ZERO, strict=True))
    ),
]


def first_firing(records: list[dict], check) -> int | None:
    """The step at which ``check`` first fires as the records land one by one (make train's monitor)."""
    for n in range(1, len(records) + 1):
        if check(observed(records[:n]), S):
            return records[n - 1]["step"]
    return None


def test_the_lr_100x_run_fires_within_its_first_steps():
    # Means of 3: 15.18 (its lowest, steps 1-3), then +2.28 a step; step 5's 19.73 > 1.25 × 15.18 = 18.98.
    assert first_firing(LR100, checks.sft_loss_rising) == 5
    # The RL part: 5 steps of 2 groups, every one all 0 (reward 0): the 5th RL step, step 15.
    assert first_firing(LR100, checks.no_learning_signal) == 15
    assert "100% of groups" in checks.no_learning_signal(observed(LR100), S)


def test_the_healthy_default_run_fires_nothing():
    fired = {rule.name: first_firing(HEALTHY, rule.check) for rule in RULES}
    assert fired == dict.fromkeys(fired), fired
    # Without the solved-task exemption its last 5 steps (10 of 10 groups equal, reward 0.93) would fire.
    unexempt = AlertSettings.model_construct(no_signal_solved_reward=1.1)
    assert "100% of groups" in checks.no_learning_signal(observed(HEALTHY), unexempt)


def test_sft_loss_rising_fires_above_the_factor_and_the_nats():
    assert S.sft_rise_factor == 1.25 and S.sft_rise_min == 1.0 and S.sft_rise_steps == 3
    creeping = [warm_step(i + 1, 0.03 + 0.05 * i) for i in range(10)]  # 0.03 to 0.48: ×16, but 0.45 nats
    assert checks.sft_loss_rising(observed(creeping), S) is None
    # Means of 3 from [4, 4, 4, 5, 5, 6]: 4, 4.33, 4.67, 5.33: 5.33 > 5 and 1.33 nats above 4.
    rising = [warm_step(i + 1, v) for i, v in enumerate([4, 4, 4, 5, 5, 6])]
    assert "5.33 (mean of 3 steps), up from its lowest 4" in checks.sft_loss_rising(observed(rising), S)
    assert checks.sft_loss_rising(observed(rising[:5]), S) is None  # 4.67: not 1.25 × 4


def test_clip_fraction_high_fires_on_the_window_mean():
    assert "clip fraction 0.40" in checks.clip_fraction_high(observed(run(20, clip_fraction=0.4)), S)
    one_spike = [*run(19), healthy_step(20, clip_fraction=0.5)]  # mean 0.066
    assert checks.clip_fraction_high(observed(one_spike), S) is None


def test_non_finite_fires_on_inf_and_on_a_nan_left_out_of_the_log():
    assert "non-finite loss" in checks.non_finite(observed([*run(5), healthy_step(6, loss=math.inf)]), S)
    nan_step = {k: v for k, v in healthy_step(6).items() if k != "grad_norm"}
    assert "grad_norm" in checks.non_finite(observed([*run(5), nan_step]), S)
    assert checks.non_finite(observed(run(30)), S) is None


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_thresholds_are_settings_fields(rule):
    assert set(rule.thresholds) <= set(AlertSettings.model_fields)
    assert rule.action and rule.summary


# A long smol-cpu run at its plateau (92 RL steps of bench.soak, seed 0, before any fault): 2 groups of 4 a step,
# the policy sure of its format (entropy 3% of its peak, logged only on steps with a learning signal) and its
# reward between 0 and 1 a step around 0.6, up from 0.
PLATEAU_REWARDS = [
    0.0,
    0.0,
    0.125,
    0.375,
    0.25,
    0.25,
    1.0,
    0.875,
    0.875,
    0.875,
    0.375,
    1.0,
    0.0,
    0.5,
    0.5,
    1.0,
    1.0,
    1.0,
    0.0,
    0.875,
    0.5,
    0.5,
    0.5,
    0.375,
    0.5,
    1.0,
    0.5,
    1.0,
    1.0,
    0.875,
    0.5,
    0.5,
    1.0,
    0.5,
    0.0,
    0.0,
    1.0,
    1.0,
    1.0,
    0.0,
    0.5,
    0.5,
    0.5,
    0.5,
    0.5,
    0.5,
    0.0,
    0.75,
    0.5,
    0.5,
    1.0,
    0.5,
    0.5,
    0.0,
    0.625,
    1.0,
    0.5,
    1.0,
    0.5,
    1.0,
    0.0,
    0.625,
    1.0,
    0.5,
    0.5,
    1.0,
    0.5,
    0.5,
    0.5,
    0.5,
    0.5,
    0.25,
    0.5,
    0.5,
    1.0,
    0.5,
    0.5,
    1.0,
    1.0,
    0.5,
    0.5,
    0.5,
    0.5,
    1.0,
    1.0,
    0.5,
    1.0,
    0.5,
    1.0,
    0.5,
    0.5,
    0.5,
]
PLATEAU_ENTROPY = [
    None,
    None,
    1.621,
    0.981,
    1.609,
    0.195,
    None,
    0.199,
    0.332,
    0.054,
    0.047,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    0.043,
    None,
    None,
    None,
    0.087,
    None,
    None,
    None,
    None,
    None,
    0.054,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    0.066,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    0.325,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    None,
]


def plateau() -> list[dict]:
    records = []
    for i, (reward, entropy) in enumerate(zip(PLATEAU_REWARDS, PLATEAU_ENTROPY, strict=True)):
        record = healthy_step(i + 1, reward_mean=reward)
        record.pop("rl_entropy")
        records.append(record if entropy is None else record | {"rl_entropy": entropy})
    return records


def test_a_long_run_at_its_plateau_neither_collapses_nor_drops():
    records = plateau()
    for n in range(12, len(records) + 1):
        assert checks.entropy_collapse(observed(records[:n]), S) is None, n
        assert checks.reward_drop(observed(records[:n]), S) is None, n
    # Without the learned-gain exemption its entropy (0.047 nats, 3% of 1.621) collapsed at its 11th RL step.
    unexempt = AlertSettings.model_construct(entropy_learned_gain=1.1)
    assert "3% of its peak" in checks.entropy_collapse(observed(records[:11]), unexempt)
    # Without the noise margin a window of 0.56 under the peak window's 0.74 is a drop.
    assert any(
        checks.reward_drop(observed(records[:n]), AlertSettings.model_construct(reward_drop_z=0)) for n in range(12, 93)
    )
