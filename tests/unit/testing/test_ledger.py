"""testing/ledger.py's checks (the fault suite's and the soak's one definition) on hand-made ledgers."""

from __future__ import annotations

from testing.ledger import Ledger, exact_problems, problems


def _ledger(**over) -> Ledger:
    base = {
        "groups": {"1-0": "a", "2-0": "b", "3-0": "c", "4-0": "d"},
        "delivered": {"1-0", "2-0", "3-0"},
        "pending": {"3-0"},
        "dead": {},
        "trained": ["a", "b"],
        "covered": set(),
    }
    return Ledger(**{**base, **over})


def test_sound_ledger():
    assert problems(_ledger()) == []
    assert exact_problems(_ledger()) == []  # c is pending untrained: the next start trains it


def test_twice_lost_dead_and_pending_trained():
    assert "trained twice" in problems(_ledger(trained=["a", "b", "b"]))[0]
    assert "(lost)" in problems(_ledger(trained=["a"]))[0]
    assert "dead-lettered groups trained" in problems(_ledger(dead={"2-0": "oov"}, trained=["a", "b"]))[-1]
    assert any("next start trains it again" in p for p in exact_problems(_ledger(trained=["a", "b", "c"])))
    assert exact_problems(_ledger(trained=["a", "b", "c"], covered={"3-0"})) == []


def test_a_windowed_checkpoint_only_answers_for_its_window():
    # The checkpoint names the last 1 of 2 groups trained: a's absence is not a loss.
    led = _ledger(trained=["b"], groups_trained=2)
    assert not led.whole
    assert problems(led) == []
    assert exact_problems(led) == []
