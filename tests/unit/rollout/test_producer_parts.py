"""Prompt queue order and re-queueing, and the settings' per-role budgets (failure labels: ``tests/unit/test_retry.py``)."""

from __future__ import annotations

import random

import pytest

from agents.datasets import PromptRecord
from services.rollout.config import RolloutSettings
from services.rollout.producer import PromptQueue

RECORDS = [PromptRecord(prompt_id=f"p{i}", question=f"q{i}", golden_answers=["a"]) for i in range(3)]


def test_queue_epochs_and_requeue_first():
    q = PromptQueue(RECORDS, seed=1, epochs=2)
    first = [q.next().prompt_id for _ in range(3)]
    assert sorted(first) == ["p0", "p1", "p2"]
    failed = RECORDS[0]
    assert q.requeue(failed, max_failures=2)
    assert q.next() is failed  # retried before new prompts
    assert not q.requeue(failed, max_failures=2)  # second failure: dropped
    assert sorted(q.next().prompt_id for _ in range(3)) == ["p0", "p1", "p2"]
    assert q.next() is None  # two epochs done


def test_budgets_per_role():
    s = RolloutSettings.load(max_turns=5, coda={"executor_max_turns": 2}, max_tokens_per_turn=64)
    budgets = s.budgets()
    assert budgets["planner"].max_turns == 5 and budgets["executor"].max_turns == 2
    assert budgets["policy"].max_tokens == 64 and budgets["worker"].max_turns == 1
    assert RolloutSettings.load(agent="coda").metric == "f1" and s.metric == "em"


# Kinds by agents.question_kinds: a choice names its answer in the question or answers yes/no.
KINDS = [
    PromptRecord(prompt_id="o0", question="Who directed the film Gamma?", golden_answers=["Jane Doe"]),
    PromptRecord(prompt_id="c0", question="Which film came out first, Alpha or Beta?", golden_answers=["Alpha"]),
    PromptRecord(prompt_id="o1", question="Where was Zeta born?", golden_answers=["Paris"]),
    PromptRecord(prompt_id="c1", question="Are Delta and Epsilon both American?", golden_answers=["yes"]),
    PromptRecord(prompt_id="c2", question="Was Eta or Theta born first?", golden_answers=["Theta"]),
]


def epochs_of(q: PromptQueue, epochs: int) -> list[list[str]]:
    """Each epoch's prompt ids (read off ``q.epoch``: an epoch's length varies with choice_weight < 1)."""
    out: list[list[str]] = []
    while (record := q.next()) is not None:
        if len(out) < q.epoch:
            out.append([])
        out[-1].append(record.prompt_id)
    assert len(out) == epochs
    return out


def test_choice_weight_one_keeps_the_order_of_the_plain_seeded_shuffle():
    q = PromptQueue(KINDS, seed=3, epochs=3, choice_weight=1.0)
    assert q.choices == {"c0", "c1", "c2"}
    rng, expected = random.Random(3), []
    for _ in range(3):  # the order before choice_weight existed: one seeded shuffle per epoch
        order = list(KINDS)
        rng.shuffle(order)
        expected.append([r.prompt_id for r in order])
    assert epochs_of(q, 3) == expected
    assert epochs_of(PromptQueue(KINDS, seed=3, epochs=3), 3) == expected  # the default is 1


def test_choice_weight_zero_keeps_only_the_open_questions():
    for epoch in epochs_of(PromptQueue(KINDS, seed=3, epochs=4, choice_weight=0.0), 4):
        assert sorted(epoch) == ["o0", "o1"]
    with pytest.raises(ValueError, match="choice_weight=0 leaves no prompts: all 3 are choice questions"):
        PromptQueue([KINDS[1], KINDS[3], KINDS[4]], choice_weight=0.0)
    with pytest.raises(ValueError, match=r"within \[0, 1\]"):
        PromptQueue(KINDS, choice_weight=1.5)


def test_choice_weight_half_thins_the_choices_reproducibly():
    # seed 3 shuffles the first epoch to o0 o1 c1 c2 c0; the choice generator's first draws are 0.79, 0.93,
    # 0.31: c1 and c2 are left out (≥ 0.5), c0 kept
    first = epochs_of(PromptQueue(KINDS, seed=3, epochs=1, choice_weight=0.5), 1)
    assert first == [["o0", "o1", "c0"]]
    many = epochs_of(PromptQueue(KINDS, seed=3, epochs=400, choice_weight=0.5), 400)
    assert many == epochs_of(PromptQueue(KINDS, seed=3, epochs=400, choice_weight=0.5), 400)  # same seed, same run
    assert all({"o0", "o1"} <= set(epoch) for epoch in many)  # every open question, every epoch
    kept = sum(len(epoch) - 2 for epoch in many) / (3 * 400)
    assert 0.45 < kept < 0.55  # 1200 draws at p = 0.5: σ ≈ 0.014
    assert epochs_of(PromptQueue(KINDS, seed=4, epochs=400, choice_weight=0.5), 400) != many


def test_an_epoch_without_prompts_is_passed_over():
    choices = [KINDS[1], KINDS[3], KINDS[4]]
    q = PromptQueue(choices, seed=0, choice_weight=0.01)  # cycling forever: some epoch keeps one
    assert q.next() in choices and q.epoch > 1


def test_rollout_settings_of_the_two_levers():
    s = RolloutSettings.load()
    assert s.choice_weight == 1.0 and s.drop_flat_groups is False  # both off by default
    assert RolloutSettings.load(choice_weight=0.25, drop_flat_groups=True).choice_weight == 0.25
    with pytest.raises(ValueError, match="less than or equal to 1"):
        RolloutSettings.load(choice_weight=1.5)
