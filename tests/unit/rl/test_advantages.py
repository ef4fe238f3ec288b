"""services.trainer.rl.advantages: hand-computed values and the sum-to-zero property."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.trainer.rl.advantages import group_advantages, normalise_group, role_advantages, trajectory_advantages
from tests.factories import make_group


def test_grpo_unbiased_hand_computed():
    # rewards 1, 0: mean 0.5, unbiased std = sqrt(0.5) = 0.7071 -> ±0.7071 (CoDA's "±0.707 with n_agent 2")
    a = normalise_group(np.array([1.0, 0.0]), eps=0.0)
    assert a == pytest.approx([2**-0.5, -(2**-0.5)])


def test_grpo_population_and_eps():
    # rewards 0, 0, 3: mean 1, population std sqrt(2) -> (-1, -1, 2)/sqrt(2)
    a = normalise_group(np.array([0.0, 0.0, 3.0]), std="population", eps=0.0)
    assert a == pytest.approx(np.array([-1, -1, 2]) / 2**0.5)
    b = normalise_group(np.array([0.0, 0.0, 3.0]), std="population", eps=1.0)
    assert b == pytest.approx(np.array([-1, -1, 2]) / (2**0.5 + 1))


def test_dr_grpo_and_rloo_hand_computed():
    r = np.array([1.0, 2.0, 6.0])  # mean 3
    assert normalise_group(r, "dr_grpo") == pytest.approx([-2, -1, 3])
    # RLOO: 1 − mean(2, 6) = −3; 2 − mean(1, 6) = −1.5; 6 − mean(1, 2) = 4.5
    assert normalise_group(r, "rloo") == pytest.approx([-3, -1.5, 4.5])


def test_rft_is_one_on_the_correct_samples_without_a_baseline():
    # threshold 0.5: 0.5 and 1.0 count as correct, 0.49 does not; a group all right still teaches
    assert normalise_group(np.array([0.0, 0.5, 1.0, 0.49]), "rft", threshold=0.5) == pytest.approx([0, 1, 1, 0])
    res = group_advantages([1.0, 1.0, 0.2, 0.0, -3.0, 3.0], ["a", "a", "b", "b", "c", "c"], "rft", threshold=0.5)
    assert res.advantages == pytest.approx([1, 1, 0, 0, 0, 1])
    assert res.zero_variance == ["b"]  # no correct sample: no signal; "a" (all right) is not flat under rft
    # per role, CoDA-style rewards (6*F1 - 3 + shaping) with threshold 0: the planner and one executor right
    per_role = role_advantages(
        [0.4, -2.9, 1.1, -3.0],
        ["g", "g", "g", "g"],
        ["planner", "planner", "executor", "executor"],
        ["p0", "p1", "e0", "e1"],
        [None, None, "p0", "p1"],
        mode="per_role",
        estimator="rft",
        threshold=0.0,
    )
    assert per_role.advantages == pytest.approx([1, 0, 1, 0])


def test_groups_keyed_by_id_not_position():
    res = group_advantages([1, 5, 0, 5], ["g1", "g2", "g1", "g2"], eps=0.0)
    assert res.advantages[[0, 2]] == pytest.approx([2**-0.5, -(2**-0.5)])
    assert res.advantages[[1, 3]] == pytest.approx([0, 0])
    assert res.zero_variance == ["g2"]


def test_group_collision_across_sources_does_not_happen_with_unique_ids():
    # Search-R1 and CoDA keyed groups by a per-source index: nq#0 and hotpotqa#0 would share a baseline.
    unique = group_advantages([1, 0, 1, 1], ["nq/0/a", "nq/0/a", "hotpotqa/0/b", "hotpotqa/0/b"], eps=0.0)
    assert unique.advantages[2:] == pytest.approx([0, 0])
    assert unique.zero_variance == ["hotpotqa/0/b"]


def test_singleton_group_gets_zero_and_is_reported():
    res = group_advantages([3.0], ["g"])
    assert res.advantages.tolist() == [0.0] and res.singleton == ["g"]


def test_unknown_estimator_and_length_mismatch():
    with pytest.raises(ValueError):
        normalise_group(np.array([1.0, 2.0]), "ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        group_advantages([1, 2], ["g"])


ROWS = dict(  # two planners (p1 R=1, p2 R=0), p1 has executors e1 e2, p2 has e3
    rewards=[1.0, 0.0, 1.0, 1.0, 0.0],
    group_ids=["g"] * 5,
    roles=["planner", "planner", "executor", "executor", "executor"],
    sample_ids=["p1", "p2", "e1", "e2", "e3"],
    parent_ids=[None, None, "p1", "p1", "p2"],
)


def test_executors_inherit_planner_advantage():
    a = role_advantages(**ROWS, mode="inherit", eps=0.0).advantages
    s = 2**-0.5
    assert a == pytest.approx([s, -s, s, s, -s])


def test_per_role_baselines():
    a = role_advantages(**ROWS, mode="per_role", estimator="dr_grpo").advantages
    # planners: mean 0.5 -> ±0.5; executors: mean 2/3 -> 1/3, 1/3, −2/3
    assert a == pytest.approx([0.5, -0.5, 1 / 3, 1 / 3, -2 / 3])


def test_pooled_baseline():
    a = role_advantages(**ROWS, mode="pooled", estimator="dr_grpo").advantages
    assert a == pytest.approx(np.array(ROWS["rewards"]) - 0.6)


def test_inherit_missing_parent_raises():
    bad = {**ROWS, "parent_ids": [None, None, "p9", "p1", "p2"]}
    with pytest.raises(ValueError, match="p9"):
        role_advantages(**bad)


def test_trajectory_advantages_over_protocol_groups():
    g1, g2 = make_group(n=2), make_group(n=2)
    for g, rewards in ((g1, (1.0, 0.0)), (g2, (2.0, 2.0))):
        for s, r in zip(g.samples, rewards, strict=True):
            s.reward = r
    adv, res = trajectory_advantages([g1, g2], estimator="dr_grpo")
    assert adv[f"{g1.group_id}/{g1.samples[0].sample_id}"] == pytest.approx(0.5)
    assert res.zero_variance == [g2.group_id]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.floats(-10, 10, allow_nan=False)), min_size=1, max_size=24),
    st.sampled_from(["grpo", "dr_grpo", "rloo"]),
    st.sampled_from(["unbiased", "population"]),
)
def test_advantages_sum_to_zero_per_group(rows, estimator, std):
    keys = [f"g{k}" for k, _ in rows]
    res = group_advantages([r for _, r in rows], keys, estimator, std)
    for k in set(keys):
        idx = [i for i, kk in enumerate(keys) if kk == k]
        assert abs(res.advantages[idx].sum()) < 1e-6 * max(1.0, np.abs(res.advantages[idx]).max())


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.floats(-5, 5, allow_nan=False)), min_size=1, max_size=16),
    st.sampled_from(["grpo", "dr_grpo", "rloo"]),
)
def test_role_advantages_sum_to_zero_per_group_and_role(rows, estimator):
    # Every group gets one planner first so that executors always have a parent.
    rows = [(g, False, 1.0) for g in sorted({g for g, _, _ in rows})] + rows
    group_ids = [f"g{g}" for g, _, _ in rows]
    roles = ["executor" if ex else "planner" for _, ex, _ in rows]
    sample_ids = [f"s{i}" for i in range(len(rows))]
    first_planner = {g: f"s{i}" for i, (g, ex, _) in reversed(list(enumerate(rows))) if not ex}
    parents = [first_planner[g] if ex else None for g, ex, _ in rows]
    rewards = [r for _, _, r in rows]
    per_role = role_advantages(rewards, group_ids, roles, sample_ids, parents, mode="per_role", estimator=estimator)
    inherit = role_advantages(rewards, group_ids, roles, sample_ids, parents, mode="inherit", estimator=estimator)
    for key in {(g, r) for g, r in zip(group_ids, roles, strict=True)}:
        idx = [i for i, gr in enumerate(zip(group_ids, roles, strict=True)) if gr == key]
        assert abs(per_role.advantages[idx].sum()) < 1e-6 * max(1.0, np.abs(per_role.advantages[idx]).max())
        if key[1] == "planner":
            assert abs(inherit.advantages[idx].sum()) < 1e-6 * max(1.0, np.abs(inherit.advantages[idx]).max())
    for i, p in enumerate(parents):
        if p is not None:
            assert inherit.advantages[i] == inherit.advantages[sample_ids.index(p)]
