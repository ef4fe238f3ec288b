"""make train's progress lines and summary, from a trainer log and eval files written here."""

from __future__ import annotations

import json

from launcher.report import read_eval, render_summary, training_progress


def write_eval(folder, metrics, n=10):
    folder.mkdir(parents=True)
    (folder / "r.json").write_text(
        json.dumps({"by_source": {"lookup": {"n": n, **metrics}, "ALL": {"n": n, **metrics}}, "failed": 0})
    )


def test_progress_and_summary(tmp_path):
    log = tmp_path / "trainer" / "train.jsonl"
    assert training_progress(log, 10, 3.0) == (0, "training: waiting for the first step (3s)")
    log.parent.mkdir()
    rows = [{"step": s, "reward_mean": s / 10, "loss": 1.0 - s / 10} for s in range(1, 11)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 11, "rew')  # last line half-written
    step, line = training_progress(log, 10, 42.0)
    assert step == 10 and "step 10/10" in line and "reward_mean=1.000" in line
    write_eval(tmp_path / "eval" / "step0", {"em": 0.0, "f1": 0.1, "search_hit": 0.0})
    write_eval(tmp_path / "eval" / "final", {"em": 0.5, "f1": 0.6, "search_hit": 0.9})
    before, after = read_eval(tmp_path / "eval" / "step0"), read_eval(tmp_path / "eval" / "final")
    assert after.metrics == {"search_hit": 0.9, "em": 0.5, "f1": 0.6}
    summary = render_summary(tmp_path, before, after, 600)
    assert "| search_hit | 0.000 | 0.900 |" in summary
    assert "| f1 | 0.100 | 0.600 |" in summary
    assert "| training reward (mean of first/last 5 steps) | 0.300 | 0.800 |" in summary
    assert "10.0 min (10 optimizer steps)" in summary


def test_a_warm_start_gets_its_own_column(tmp_path):
    log = tmp_path / "trainer" / "train.jsonl"
    log.parent.mkdir()
    rows = [{"step": s} for s in range(1, 6)] + [{"step": s, "reward_mean": 0.5} for s in range(6, 11)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for label, f1 in (("step0", 0.0), ("warm", 0.6), ("final", 0.9)):
        write_eval(tmp_path / "eval" / label, {"f1": f1})
    before, warm, after = (read_eval(tmp_path / "eval" / label) for label in ("step0", "warm", "final"))
    summary = render_summary(tmp_path, before, after, 60, warm=(5, warm))
    assert "| step 0 | warm start (step 5) | step 10 |" in summary
    assert "| f1 | 0.000 | 0.600 | 0.900 |" in summary
    # The warm start's steps have no reward: the first rewarded steps are the ones after it.
    assert "| training reward (mean of first/last 5 steps) | — | 0.500 | 0.500 |" in summary
    assert str(warm.path) in summary
