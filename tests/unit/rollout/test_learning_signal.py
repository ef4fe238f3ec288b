"""Which groups teach: the one definition (``shared.protocol.trajectory``) per role mode, checked by hand and against
the trainer's own advantages (a group has signal exactly when some row's advantage is nonzero)."""

from __future__ import annotations

import itertools
import random

import pytest

from services.rollout.producer import group_has_signal
from services.trainer.rl.advantages import group_advantages, role_advantages
from shared.protocol import Sample, TrajectoryGroup
from shared.protocol.trajectory import flat, has_signal

P, E = "planner", "executor"


def test_flat_is_one_row_or_all_equal():
    assert flat([]) and flat([1.0]) and flat([0.5, 0.5, 0.5])
    assert not flat([1.0, 0.0]) and not flat([0.5, 0.5, 0.5000001])


@pytest.mark.parametrize(
    ("rewards", "roles", "expected"),
    [
        # planners differ: every mode learns
        ([1.0, 0.0, 0.3, 0.3], [P, P, E, E], {"inherit": True, "per_role": True, "pooled": True, None: True}),
        # planners tie, executors differ: per_role learns from the executors, inherit copies the planners' 0
        ([1.0, 1.0, 0.2, 0.7], [P, P, E, E], {"inherit": False, "per_role": True, "pooled": True, None: True}),
        # each role ties but the roles differ: only the pooled baseline sees a difference
        ([1.0, 1.0, 0.0, 0.0], [P, P, E, E], {"inherit": False, "per_role": False, "pooled": True, None: True}),
        # all equal: nothing anywhere
        ([0.5, 0.5, 0.5, 0.5], [P, P, E, E], {"inherit": False, "per_role": False, "pooled": False, None: False}),
        # a single planner (n_samples=1): inherit and per_role have a singleton baseline
        ([1.0, 0.0], [P, E], {"inherit": False, "per_role": False, "pooled": True, None: True}),
        # flat single-role agent
        ([0.0, 1.0, 1.0], ["policy"] * 3, {"inherit": True, "per_role": True, "pooled": True, None: True}),
        ([1.0, 1.0, 1.0], ["policy"] * 3, {"inherit": False, "per_role": False, "pooled": False, None: False}),
    ],
)
def test_has_signal_per_role_mode(rewards, roles, expected):
    for mode, want in expected.items():
        assert has_signal(rewards, roles, mode) is want, mode


def test_any_mode_is_not_all_rewards_equal_and_unknown_modes_are_refused():
    assert has_signal([0.0, 0.0, 0.0, 1.0], [P, P, E, E]) and not has_signal([0.0] * 4, [P, P, E, E])
    with pytest.raises(ValueError, match="unknown role mode"):
        has_signal([1.0, 0.0], [P, P], "by_vibes")
    with pytest.raises(ValueError, match="2 rewards for 1 roles"):
        has_signal([1.0, 0.0], [P])


def test_signal_is_exactly_a_nonzero_trainer_advantage():
    """For random CoDA-shaped groups (2-3 planners, 0-2 executors each, rewards from a small set so ties are
    common), ``has_signal(mode)`` agrees with the trainer: some row's advantage is nonzero under that mode."""
    rng = random.Random(7)
    for _ in range(300):
        rewards, roles, sample_ids, parents = [], [], [], []
        for p in range(rng.randint(2, 3)):
            rewards.append(rng.choice([0.0, 0.5, 1.0]))
            roles.append(P)
            sample_ids.append(f"p{p}")
            parents.append(None)
            for e in range(rng.randint(0, 2)):
                rewards.append(rng.choice([0.0, 1.0]))
                roles.append(E)
                sample_ids.append(f"p{p}e{e}")
                parents.append(f"p{p}")
        for mode in ("inherit", "per_role", "pooled"):
            for estimator in ("grpo", "dr_grpo", "rloo"):
                adv = role_advantages(rewards, ["g"] * len(rewards), roles, sample_ids, parents, mode, estimator)
                assert has_signal(rewards, roles, mode) == bool((adv.advantages != 0).any()), (rewards, roles, mode)
        # under no mode: the union of the three
        assert has_signal(rewards, roles) == any(
            has_signal(rewards, roles, m) for m in ("inherit", "per_role", "pooled")
        )


def test_trainer_counts_zero_variance_with_the_same_test():
    result = group_advantages([1.0, 1.0, 0.0, 1.0, 0.25], ["a", "a", "b", "b", "c"])
    assert result.zero_variance == ["a"] and result.singleton == ["c"]
    assert list(result.advantages[:2]) == [0.0, 0.0] and result.advantages[4] == 0.0


def _group(rewards_roles: list[tuple[float, str]]) -> TrajectoryGroup:
    samples, planner = [], None
    for i, (reward, role) in enumerate(rewards_roles):
        if role == P:
            planner = f"s{i}"
        samples.append(
            Sample(
                sample_id=f"s{i}",
                role=role,
                parent_id=planner if role == E else None,
                token_ids=[1, 2, 3],
                prompt_len=1,
                loss_mask=[0, 1, 1],
                logprobs=[0.0, -0.1, -0.1],
                versions=[-1, 0, 0],
                reward=reward,
            )
        )
    return TrajectoryGroup(group_id="g", prompt_id="p", agent="coda", policy_version=0, created_at=0.0, samples=samples)


def test_producer_asks_for_signal_under_any_role_mode():
    # per-role signal only (planners tie, executors differ): kept, a per_role trainer learns from it
    assert group_has_signal(_group([(1.0, P), (0.0, E), (1.0, P), (1.0, E)]))
    # pooled signal only (each role ties): kept
    assert group_has_signal(_group([(1.0, P), (0.0, E), (1.0, P), (0.0, E)]))
    assert not group_has_signal(_group([(0.0, P), (0.0, E), (0.0, P), (0.0, E)]))
    assert not group_has_signal(_group([(1.0, "policy"), (1.0, "policy")]))


def test_itertools_cases_of_two_roles():
    # every reward assignment of 2 planners and 2 executors over {0, 1}: any-mode signal iff not all equal
    for values in itertools.product([0.0, 1.0], repeat=4):
        assert has_signal(list(values), [P, P, E, E]) == (len(set(values)) > 1)
