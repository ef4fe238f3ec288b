"""bench/_qa_report.py: the bootstrap interval against numbers worked out by hand, seeds pooled per question,
and the targets judged from the intervals (a report that could not say "not met" would check nothing)."""

from __future__ import annotations

import pytest

from tests.unit.bench_module import bench_module


@pytest.fixture(scope="module")
def report():
    with bench_module("_qa_report") as module:
        yield module


def test_bootstrap_interval_of_a_constant_is_the_constant(report):
    assert report.bootstrap_ci([0.25] * 40) == (0.25, 0.25, 0.25)


def test_bootstrap_interval_matches_the_normal_approximation(report):
    # 100 questions, half right: mean 0.5, standard error sqrt(0.25 / 100) = 0.05, so 95% ≈ 0.5 ± 0.098.
    mean, lo, hi = report.bootstrap_ci([0.0] * 50 + [1.0] * 50, n_boot=4000)
    assert mean == 0.5
    assert lo == pytest.approx(0.402, abs=0.015) and hi == pytest.approx(0.598, abs=0.015)


def test_seeds_are_pooled_per_question(report):
    runs = [{"rows": [{"id": "a", "f1": 1.0}, {"id": "b", "f1": 0.0}]}, {"rows": [{"id": "a", "f1": 0.5}]}]
    assert report.per_question(runs, "f1") == {"a": 0.75, "b": 0.0}


def _run(f1s, train_s=0.0, types=None):
    types = types or ["bridge"] * len(f1s)
    rows = [
        {"id": str(i), "type": t, "em": float(f == 1.0), "f1": f, "searches": 1, "tokens": 20, "hit": 1.0}
        for i, (f, t) in enumerate(zip(f1s, types, strict=True))
    ]
    return {"rows": rows, "train_s": train_s, "steps": 10, "s_per_rl_step": 12.0, "peak_rss_mb": {"trainer": 2000.0}}


def test_targets_say_met_only_when_the_gap_and_disjoint_intervals_hold(report, tmp_path):
    low, high = [0.0] * 80 + [1.0] * 20, [0.0] * 40 + [1.0] * 60  # F1 0.20 against 0.60
    doc = {
        "config": {"train_s": 600, "warm_steps": 10, "limit": None, "seeds": [0, 1]},
        "runs": {
            "hotpotqa/zero-shot": _run(low),
            "hotpotqa/naive-rag": _run(low),
            "hotpotqa/sft/0": _run(low, 600),
            "hotpotqa/flat/0": _run(high, 600),
            "hotpotqa/flat/1": _run(high, 600),
        },
    }
    lines = report.targets(doc, "hotpotqa")
    assert sum("→ met" in line for line in lines) == 3  # both gaps, and 0.60 >= 0.35
    md = tmp_path / "qa.md"
    report.write_report(doc, md)
    text = md.read_text()
    assert "| (d) flat Search-R1, GRPO + RED | 2 | 100 |" in text and "bridge (n=100)" in text
    assert "## 2WikiMultihopQA" not in text  # no runs, no section
    near = [0.0] * 72 + [1.0] * 28  # F1 0.28: +0.08 over the untrained methods, under the 0.35 bar
    doc["runs"]["hotpotqa/flat/0"] = doc["runs"]["hotpotqa/flat/1"] = _run(near, 600)
    lines = report.targets(doc, "hotpotqa")
    assert [line.endswith(")") and "→ not met" in line for line in lines] == [True, True, True]


def test_methods_are_compared_on_the_questions_all_of_them_evaluated(report):
    wide = _run([1.0] * 50 + [0.0] * 50)  # an earlier run over 100 questions
    narrow = _run([0.0] * 40)  # the others over the first 40
    doc = {"runs": {"2wiki/zero-shot": wide, "2wiki/flat/0": narrow}}
    (zero_shot,) = report._runs(doc, "2wiki", "zero-shot")
    assert len(zero_shot["rows"]) == 40 and report.per_question([zero_shot], "f1") == {str(i): 1.0 for i in range(40)}


def test_a_row_shows_the_rl_signal_and_what_ran(report):
    runs = [
        {**_run([0.5] * 4, 600), "reward_first": 0.1, "reward_last": 0.3, "commit": "abc1234"},
        {**_run([0.5] * 4, 600), "reward_first": 0.3, "reward_last": 0.5, "commit": "abc1234"},
    ]
    doc = {"runs": {"2wiki/flat/0": runs[0], "2wiki/flat/1": runs[1], "2wiki/sft/0": _run([0.5] * 4, 600)}}
    flat, sft = report.method_row(doc, "2wiki", "flat"), report.method_row(doc, "2wiki", "sft")
    assert "| 0.200 → 0.400 |" in flat and flat.endswith("| abc1234 |")
    assert "| – |" in sft and sft.endswith("| ? |")  # no RL steps; recorded without a commit


def test_coda_delegations_are_counted_from_the_eval_rows_facts(report):
    question = "Which city hosts the university whose fight song is Kansas Song?"
    row = {
        "question": question,
        "golden_answers": ["Lawrence", "Lawrence, Kansas"],
        "prediction": "lawrence.",
        "facts": {
            "tasks": [question, "Which university has the fight song Kansas Song?", "Where is it?"],
            "executor_answers": ["University of Kansas", "", "Lawrence, Kansas"],
        },
    }
    got = report.delegations(row)
    # The first task is the question verbatim (F1 1.0); the others share few tokens with it. The third
    # executor's answer matches a gold alias exactly; the final answer "lawrence." normalises to "lawrence",
    # which no executor said word for word.
    assert got == {"tasks": 3, "restated": 1, "executor_f1": 1.0, "passed_on": False}
    assert report.delegations({**row, "prediction": "Lawrence, Kansas"})["passed_on"] is True
    assert report.delegations({"question": "q", "facts": None}) == {}  # a flat agent's row


def test_the_report_tables_codas_delegations(report, tmp_path):
    rows = [
        {"id": str(i), "type": "bridge", "em": 0.0, "f1": f, "searches": 1, "tokens": 20, "hit": 1.0,
         "tasks": t, "restated": r, "executor_f1": e, "passed_on": p}
        for i, (f, t, r, e, p) in enumerate([(0.0, 1, 1, 0.5, False), (1.0, 2, 0, 1.0, True)])
    ]  # fmt: skip
    doc = {"config": {"train_s": 600, "warm_steps": 10}, "runs": {"2wiki/coda/0": {"rows": rows, "train_s": 600}}}
    report.write_report(doc, tmp_path / "qa.md")
    # 3 tasks over 2 questions; one question split; 1 of 3 tasks restates; executors' best F1 (0.5 + 1.0) / 2.
    assert "| 2wiki/coda/0 | 2 | 1.50 | 50% | 33% | 0.750 | 50% | 0.500 |" in (tmp_path / "qa.md").read_text()


def test_seconds_per_sft_step_tell_the_machines_speed(report):
    assert report.sft_step_s({"train_s": 600.0, "steps": 40, "rl_steps": 0}) == 15.0  # SFT only: the whole run
    assert report.sft_step_s({"train_s": 643.0, "warm_s": 110.0, "steps": 26, "rl_steps": 16}) == 11.0  # warm start
    assert report.sft_step_s({"train_s": 0.0}) is None  # untrained


def test_a_run_records_what_its_trainer_computed_in(monkeypatch, tmp_path):
    from shared import precision

    recipe = tmp_path / "r.toml"
    recipe.write_text('[rollout]\nagent = "search-r1"\n')
    monkeypatch.delenv("CODA_TRAINER_PRECISION", raising=False)
    with bench_module("qa", bench_on_path=True) as qa:
        monkeypatch.setattr(precision, "native_bf16", lambda: True)
        assert qa.matmul_precision(str(recipe), []) == "bf16"  # auto, on a CPU that multiplies bf16
        assert qa.matmul_precision(str(recipe), ["CODA_TRAINER_PRECISION=fp32"]) == "fp32"  # --set wins
        recipe.write_text('[trainer]\nprecision = "fp32"\n')
        assert qa.matmul_precision(str(recipe), []) == "fp32"  # the recipe's
        monkeypatch.setattr(precision, "native_bf16", lambda: False)
        recipe.write_text("")
        assert qa.matmul_precision(str(recipe), []) == "fp32"


def test_the_speed_column_names_the_precision(report):
    doc = {"runs": {"2wiki/sft/0": {**_run([0.5] * 4, 600), "steps": 40, "rl_steps": 0, "precision": "bf16"}}}
    assert "| 15.0 (bf16) |" in report.method_row(doc, "2wiki", "sft")
