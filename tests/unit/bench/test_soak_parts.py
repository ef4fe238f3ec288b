"""The soak's pure parts (bench/_soak_parts.py): the seeded schedule, RSS growth, recovery, alert attribution,
the report."""

from __future__ import annotations

from bench._soak_parts import (
    TARGETS,
    Fault,
    attribute_alerts,
    fault_dict,
    recovery_s,
    render,
    rss_growth,
    schedule,
)


def test_schedule_is_seeded_and_takes_each_target_in_turn():
    a, b = schedule(0, 60), schedule(0, 60)
    assert a == b
    assert a != schedule(1, 60)
    assert len(a) == 10  # one per 6 minutes
    start = TARGETS.index(a[0].target)
    assert [f.target for f in a] == [TARGETS[(start + i) % len(TARGETS)] for i in range(len(a))]
    assert all(f.kind in ("kill", "stop") and f.hold_s > 0 for f in a)
    times = [f.at_s for f in a]
    assert times == sorted(times)
    assert times[0] >= 0.2 * 3600 and times[-1] <= 0.8 * 3600  # room before the first and after the last


def test_schedule_quick_mode_and_every_target_in_a_short_run():
    assert len(schedule(3, 2, 2)) == 2
    assert {f.target for f in schedule(3, 10)} == set(TARGETS)  # at least one fault per target


def test_rss_growth_reads_the_last_two_thirds():
    # Grows 100 → 130 in the first third, flat after: no growth over the last two thirds.
    samples = [(t, 100 + min(t, 30)) for t in range(0, 91)]
    assert abs(rss_growth(samples)) < 1e-9
    leaking = [(t, 100 + t) for t in range(0, 91)]
    growth = rss_growth(leaking)
    assert 0.3 < growth < 0.5
    assert rss_growth([(0, 1), (1, 1)]) is None


def test_recovery_is_the_next_step_after_the_fault():
    assert recovery_s(10.0, [5.0, 9.0, 14.5, 20.0]) == 4.5
    assert recovery_s(30.0, [5.0, 9.0]) is None


def test_alerts_go_to_faults_that_may_fire_them_else_unexpected():
    trainer = Fault(10, "trainer", "kill", 2, started=100.0, ended=105.0)
    retriever = Fault(50, "retriever", "stop", 5, started=200.0, ended=205.0)
    fired = [(150.0, "TrainerNotStepping"), (210.0, "RolloutNotProducing"), (210.0, "NonFiniteLoss")]
    unexpected = attribute_alerts([trainer, retriever], fired, window_s=60)
    assert trainer.alerts == ["TrainerNotStepping"]
    assert retriever.alerts == ["RolloutNotProducing"]
    assert unexpected == [(210.0, "NonFiniteLoss")]
    late = attribute_alerts([trainer], [(500.0, "TrainerNotStepping")], window_s=60)
    assert late == [(500.0, "TrainerNotStepping")]


def _result(**over) -> dict:
    f = Fault(41, "retriever", "stop", 6, started=41, ended=47, recovery_s=9.5, alerts=["RolloutNotProducing"])
    result = {
        "command": "python -m bench.soak --minutes 2",
        "recipe": "configs/smol-cpu.toml",
        "seed": 0,
        "minutes": 2,
        "policy_servers": 2,
        "host": "h 2 CPUs",
        "recovery_bound_s": 180.0,
        "faults": [fault_dict(f)],
        "alerts": [{"t": 50.0, "line": "alert RolloutNotProducing (step 3): ..."}],
        "unexpected_alerts": [],
        "rss": {
            "trainer": {
                "growth": 0.02,
                "restarts": 0,
                "first_mib": 900,
                "third_mib": 950,
                "last_mib": 970,
                "max_mib": 980,
            }
        },
        "ledger": {"summary": "12 groups in the stream", "problems": []},
        "eval": {"n": 8, "f1": 0.5},
        "undisturbed": "lookup F1 0.979",
        "notes": [],
    }
    return {**result, **over}


def test_render_passes_and_fails():
    text = render(_result())
    assert "| ledger |" in text and "**NO**" not in text
    assert "| 1 | 41 | retriever | stop | 6.0 | 9.5 | RolloutNotProducing |" in text
    assert "lookup F1 0.979" in text
    bad = _result(
        ledger={"summary": "x", "problems": ["groups trained twice: ['g']"]},
        unexpected_alerts=[(60.0, "NonFiniteLoss")],
        rss={"rollout": {"growth": 0.25, "restarts": 1, "first_mib": 1, "third_mib": 1, "last_mib": 1, "max_mib": 1}},
    )
    text = render(bad)
    assert text.count("**NO**") == 3
    assert "groups trained twice" in text and "NonFiniteLoss" in text


def test_render_the_induced_high_lr_run():
    lr = {
        "lr": "2e-2",
        "minutes": 5,
        "steps": 9,
        "alerts": [{"t": 80.0, "line": "alert NonFiniteLoss (step 7): loss nan"}],
        "expected": ["EntropyCollapse", "NonFiniteLoss"],
        "fired_expected": ["NonFiniteLoss"],
        "notes": [],
    }
    text = render(_result(induced_lr=lr))
    assert "## Induced: learning rate 2e-2" in text
    assert "expected alerts that fired: NonFiniteLoss" in text
