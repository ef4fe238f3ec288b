"""bench/_qa_report.py: the bootstrap interval against numbers worked out by hand, seeds pooled per question,
and the targets judged from the intervals (a report that could not say "not met" would check nothing)."""

from __future__ import annotations

import os

import numpy as np
import pytest


@pytest.fixture(scope="module")
def delegations():
    from bench import _qa_delegations

    return _qa_delegations


@pytest.fixture(scope="module")
def report():
    from bench import _qa_report

    return _qa_report


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


def _run(f1s, train_s=0.0, types=None, kinds=None):
    types = types or ["bridge"] * len(f1s)
    rows = [
        {"id": str(i), "type": t, "em": float(f == 1.0), "f1": f, "searches": 1, "tokens": 20, "hit": 1.0}
        for i, (f, t) in enumerate(zip(f1s, types, strict=True))
    ]
    for row, kind in zip(rows, kinds or [], strict=False):
        if kind:
            row["kind"] = kind
    return {"rows": rows, "train_s": train_s, "steps": 10, "s_per_rl_step": 12.0, "peak_rss_mb": {"trainer": 2000.0}}


@pytest.fixture()
def no_questions(monkeypatch):
    """The fixtures' ids name no bundled question: the kinds come from the rows alone, and no baseline is drawn."""
    from bench import _qa_kinds

    monkeypatch.setattr(_qa_kinds, "lookup", lambda dataset: {})


def test_targets_are_on_open_answer_f1_and_say_met_only_when_the_bar_holds(report, no_questions, tmp_path):
    # 100 questions: 0-49 open (compositional), 50-99 choice (comparison). On the open ones flat is right on
    # 0-29 (F1 0.60) and SFT on 0-9 (0.20), so flat − sft = +0.40 with every paired difference >= 0; on the
    # choices SFT is right everywhere and flat nowhere, so overall SFT leads (0.60 against 0.30): a bar on
    # overall F1 would say the opposite.
    kinds, types = ["open"] * 50 + ["choice"] * 50, ["compositional"] * 50 + ["comparison"] * 50
    flat = [1.0] * 30 + [0.0] * 20 + [0.0] * 50
    sft = [1.0] * 10 + [0.0] * 40 + [1.0] * 50
    rag = [1.0] * 29 + [0.0] * 21 + [0.0] * 50  # open F1 0.58: flat's 0.60 is not 0.05 above it
    doc = {
        "config": {"train_s": 600, "warm_steps": 10, "limit": None, "seeds": [0, 1]},
        "runs": {
            "2wiki/sft/0": _run(sft, 600, types, kinds),
            "2wiki/rag-sft/0": _run(rag, 600, types, kinds),
            "2wiki/flat/0": _run(flat, 600, types, kinds),
            "2wiki/flat/1": _run(flat, 600, types, kinds),
        },
    }
    lines = report.targets(doc, "2wiki")
    assert lines[0].startswith("- flat − sft (RL over its own SFT only): open-answer F1 +0.400 [+")
    assert lines[0].endswith("(n=50) → met (bar: ≥ +0.05, paired interval above 0)")
    assert lines[1] == "- coda − coda-sft (RL over its own SFT only): not measured (coda and coda-sft not run)"
    assert "0.600" in lines[2] and "rag-sft 0.580 + 0.05" in lines[2] and lines[2].endswith("→ not met")
    assert lines[3].startswith("- flat arm's compositional F1: 0.600 [") and "→ met" in lines[3]
    doc["runs"]["2wiki/rag-sft/0"] = _run([1.0] * 25 + [0.0] * 75, 600, types, kinds)  # open F1 0.50
    assert report.targets(doc, "2wiki")[2].endswith("→ met")
    # flat right on 0-4 only (open F1 0.10): SFT is right on 0-9, so flat − sft = -0.10; compositional just at the bar.
    doc["runs"]["2wiki/flat/0"] = doc["runs"]["2wiki/flat/1"] = _run([1.0] * 5 + [0.0] * 95, 600, types, kinds)
    lines = report.targets(doc, "2wiki")
    assert "open-answer F1 -0.100" in lines[0] and lines[0].endswith(
        "→ not met (bar: ≥ +0.05, paired interval above 0)"
    )
    assert lines[3].startswith("- flat arm's compositional F1: 0.100 [") and "→ met" in lines[3]
    assert len(report.targets(doc, "hotpotqa")) == 3  # no runs there: nothing measured, no compositional bar
    md = tmp_path / "qa.md"
    report.write_report(doc, md)
    text = md.read_text()
    assert "| (d) flat Search-R1, GRPO + RED | 2 | 100: 50 open, 50 choice | **0.100 [" in text
    assert "compositional (open, n=50)" in text and "comparison (choice, n=50)" in text
    assert "## HotpotQA" not in text  # no runs, no section


# Four questions by hand: "0" and "1" open (their rows say so), "2" and "3" choices (told from the question: "2"
# names its gold, "3" is answered yes). The guess answers "2" with its first candidate, Alpha (F1 0), and "3"
# with "yes" (F1 1): the reading-free baseline's choice F1 is 0.5.
QUESTIONS = {
    "0": ("Who directed the film that won the prize?", ["Jane Roe"]),
    "1": ("Where was the author of Some Book born?", ["Paris"]),
    "2": ("Which film came out first, Alpha or Beta Gamma?", ["Beta Gamma"]),
    "3": ("Are Alpha and Beta both American films?", ["yes"]),
}


@pytest.fixture()
def four_questions(monkeypatch):
    from bench import _qa_kinds

    monkeypatch.setattr(_qa_kinds, "lookup", lambda dataset: QUESTIONS)
    flat = _run([1.0, 0.0, 0.0, 0.0], 600, kinds=["open", "open"])  # open 0.5, choice 0.0
    sft = _run([0.0, 0.0, 1.0, 1.0], 600, kinds=["open", "open"])  # open 0.0, choice 1.0
    return {"config": {"train_s": 600, "limit": None}, "runs": {"2wiki/sft/0": sft, "2wiki/flat/0": flat}}


def test_open_and_choice_f1_and_the_reading_free_baseline_by_hand(report, four_questions, tmp_path):
    from bench import _qa_kinds

    assert _qa_kinds.kinds("2wiki", four_questions["runs"].values()) == {
        "0": "open",
        "1": "open",
        "2": "choice",
        "3": "choice",
    }
    (mean, lo, hi), ids = report.choice_baseline(four_questions, "2wiki")
    assert (mean, ids) == (0.5, ["2", "3"]) and lo == 0.0 and hi == 1.0
    flat = report.method_row(four_questions, "2wiki", "flat", baseline=0.5)
    sft = report.method_row(four_questions, "2wiki", "sft", baseline=0.5)
    assert "| 4: 2 open, 2 choice | **0.500 [0.000, 1.000]** | 0.000 [0.000, 0.000] ↓ | 0.250 [" in flat
    assert "| **0.000 [0.000, 0.000]** | 1.000 [1.000, 1.000] | 0.500 [" in sft and "↓" not in sft
    report.write_report(four_questions, tmp_path / "qa.md")
    text = (tmp_path / "qa.md").read_text()
    assert "| reading-free choice baseline: `guess(question)` | – | 2 choice | – | 0.500 [0.000, 1.000] |" in text
    assert (
        "↓ below the reading-free baseline (0.500) on the choice questions: (d) flat Search-R1, GRPO + RED (0.000)."
        in text
    )
    assert "(c) SFT only (" not in text  # above the baseline: not named


def test_paired_differences_lead_with_the_open_questions(report, four_questions):
    lines = report.paired_table(four_questions, "2wiki")
    assert lines[3] == "| difference | **open** | choice | overall | compositional |"
    (row,) = [line for line in lines if line.startswith("| flat − sft |")]
    open_, choice, overall, compositional = row.strip("| ").split(" | ")[1:]
    # open: differences +1 and 0 → +0.5; choice: -1 and -1; overall: (1 + 0 - 1 - 1) / 4 = -0.25; no compositional.
    assert open_.startswith("+0.500 [+0.000, +1.000] (n=2)")
    assert choice == "-1.000 [-1.000, -1.000] (n=2)" and overall.startswith("-0.250 [") and compositional == "–"


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


def test_coda_delegations_are_counted_from_the_eval_rows_facts(delegations, report):
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
    got = delegations.delegations(row)
    # The first task is the question verbatim (F1 1.0); the others share few tokens with it. The third
    # executor's answer matches a gold alias exactly; the final answer "lawrence." normalises to "lawrence",
    # which no executor said word for word. The second executor said nothing; task 2 does not name task 1's
    # answer; without a plan there are no hop F1s.
    assert got == {
        "tasks": 3,
        "restated": 1,
        "executor_f1": 1.0,
        "passed_on": False,
        "passed_on_last": False,
        "empty_answers": 1,
        "chained": False,
        "planned": 0,
        "hop1_f1": None,
        "hop2_f1": None,
    }
    passed = delegations.delegations({**row, "prediction": "Lawrence, Kansas"})
    assert passed["passed_on"] is True and passed["passed_on_last"] is True  # the third, last executor's
    first = delegations.delegations({**row, "prediction": "University of Kansas"})
    assert first["passed_on"] is True and first["passed_on_last"] is False
    assert delegations.delegations({"question": "q", "facts": None}) == {}  # a flat agent's row


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
    from bench import qa

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


# ---------------------------------------------------------------- the hierarchy: arms, per-type metrics, pairs
RED_KITE = "Where was the director of film Red Kite born?"


def _coda_row(question, tasks, said, golds=("x",), prediction=""):
    return {
        "question": question,
        "golden_answers": list(golds),
        "prediction": prediction,
        "facts": {"tasks": tasks, "executor_answers": said},
    }


def test_a_coda_row_is_scored_against_its_questions_hop_plan(delegations, report):
    plan = [("Tomas Vale",), ("Oslo",)]  # agents.plans: per delegation, the answers its sub-question expects
    chained = _coda_row(
        RED_KITE,
        ["Who is the director of film Red Kite?", "Where was Tomas Vale born?"],
        ["Tomas Vale", "Oslo, Norway"],
    )
    got = delegations.delegations(chained, plan)
    # Neither task restates the question (token F1 0.67 and 0.46 < 0.8); task 2 names task 1's answer; hop 1's
    # answer is exact, hop 2's "oslo norway" against "oslo": P 1/2, R 1, F1 2/3; no executor came back empty.
    assert got["restated"] == 0 and got["chained"] is True and got["empty_answers"] == 0
    assert got["planned"] == 2 and got["hop1_f1"] == 1.0 and got["hop2_f1"] == pytest.approx(2 / 3)
    # The question delegated whole, its executor silent: restated, no chain to judge, both hops 0 (hop 2 was
    # never delegated).
    whole = delegations.delegations(_coda_row(RED_KITE, [RED_KITE], [""]), plan)
    assert (whole["restated"], whole["chained"], whole["empty_answers"]) == (1, None, 1)
    assert (whole["hop1_f1"], whole["hop2_f1"]) == (0.0, 0.0)
    # An empty first answer chains nothing (the empty string is in every task).
    unchained = delegations.delegations(
        _coda_row(RED_KITE, ["Who directed Red Kite?", "Where was he born?"], ["", "X"])
    )
    assert unchained["chained"] is False and unchained["empty_answers"] == 1
    assert (unchained["planned"], unchained["hop1_f1"], unchained["hop2_f1"]) == (0, None, None)  # no plan
    # A four-task plan (bridge_comparison): hop 1 = the first two sub-questions, hop 2 = the last two.
    four = _coda_row(
        "Which film has the director born earlier, Green Door or Red Kite?",
        ["Who directed Green Door?", "Who directed Red Kite?", "When was Ann Bell born?", "When was Bo Ek born?"],
        ["Ann Bell", "Bo Ek", "1950", "1961"],
    )
    got = delegations.delegations(four, [("Ann Bell",), ("Bo Ek",), ("1950",), ("1960",)])
    assert got["chained"] is False  # "ann bell" is not in "who directed red kite"
    assert (got["planned"], got["hop1_f1"], got["hop2_f1"]) == (4, 1.0, 0.5)


def test_hierarchy_stats_by_hand(delegations, report):
    plan = [("Tomas Vale",), ("Oslo",)]
    rows = [
        delegations.delegations(
            _coda_row(RED_KITE, ["Who is the director of film Red Kite?", "Where was Tomas Vale born?"],
                      ["Tomas Vale", "Oslo, Norway"]),
            plan,
        ),
        delegations.delegations(_coda_row(RED_KITE, [RED_KITE], [""]), plan),
        delegations.delegations(
            _coda_row("Which came first, Red Kite or Blue Sky?", ["When was Red Kite released?",
                      "When was Blue Sky released?"], ["1999", ""]),
            [("1999",), ("2001",)],
        ),
    ]  # fmt: skip
    rows = [{**row, "f1": f1} for row, f1 in zip(rows, [1.0, 0.0, 0.5], strict=True)]
    st = delegations.hierarchy_stats(rows)
    # 5 tasks over 3 questions, 2 of them split; 1 of 5 tasks restates; of the 2 split questions one chains;
    # hop 1: (1 + 0 + 1) / 3; hop 2: (2/3 + 0 + 0) / 3; empty executors: 2 of 5 tasks.
    assert st["questions"] == 3 and st["planned"] == 3
    assert st["tasks_per_q"] == pytest.approx(5 / 3) and st["split"] == pytest.approx(2 / 3)
    assert st["restating"] == pytest.approx(0.2) and st["chain"] == 0.5
    assert st["hop1_f1"] == pytest.approx(2 / 3) and st["hop2_f1"] == pytest.approx(2 / 9)
    assert st["empty"] == pytest.approx(0.4) and st["f1"] == 0.5
    # Hop 1 right (F1 >= 0.5) on questions 1 and 3: their hop 2 (2/3 and 0) averaged; every plan has 2 tasks.
    assert st["hop1_right"] == 2 and st["hop2_f1_hop1_right"] == pytest.approx(1 / 3) and st["plan_tasks"] == 2
    # No row has a final answer (their predictions are empty), so none is its last executor's.
    assert st["final_last"] == 0.0


def test_the_report_tables_the_hierarchy_by_question_type(report, tmp_path):
    base = {"em": 0.0, "searches": 1, "tokens": 20, "hit": 1.0, "passed_on": False, "executor_f1": 0.0,
            "passed_on_last": False}  # fmt: skip
    rows = [
        {**base, "id": "0", "type": "compositional", "f1": 1.0, "tasks": 2, "restated": 0, "chained": True,
         "empty_answers": 0, "planned": 2, "hop1_f1": 1.0, "hop2_f1": 0.5},
        {**base, "id": "1", "type": "compositional", "f1": 0.0, "tasks": 1, "restated": 1, "chained": None,
         "empty_answers": 1, "planned": 2, "hop1_f1": 0.0, "hop2_f1": 0.0},
        {**base, "id": "2", "type": "comparison", "f1": 0.5, "tasks": 2, "restated": 0, "chained": False,
         "empty_answers": 0, "planned": 0, "hop1_f1": None, "hop2_f1": None},
    ]  # fmt: skip
    doc = {"config": {"train_s": 600, "warm_steps": 10}, "runs": {"2wiki/coda/0": {"rows": rows, "train_s": 600}}}
    report.write_report(doc, tmp_path / "qa.md")
    text = (tmp_path / "qa.md").read_text()
    label = report.METHODS["coda"]
    # Hop 1 right only on row 0: hop 2 there is 0.5 (1 question).
    row = (
        "| compositional | 2 × 1 | 1.50 | 2.00 | 50% | 33% | 100% | 2 | 0.500 | 0.250 | 0.500 (1) | 33% | 0% | 0.500 |"
    )
    assert f"| {label} {row}" in text
    assert f"| {label} | comparison | 1 × 1 | 2.00 | – | 100% | 0% | 0% | 0 | – | – | – (0) | 0% | 0% | 0.500 |" in text
    assert f"| {label} | all | 3 × 1 |" in text


def test_paired_interval_of_identical_arms_is_zero_and_of_a_constant_gap_the_gap(report):
    rng = np.random.default_rng(1)
    a = {str(i): float(x) for i, x in enumerate(rng.random(60))}
    assert report.paired_ci(a, dict(a)) == (0.0, 0.0, 0.0)
    b = {q: x - 0.25 for q, x in a.items()}  # every question 0.25 better in a: the paired interval is 0.25 alone,
    mean, lo, hi = report.paired_ci(a, b)  # where unpaired intervals of a and b would overlap widely
    assert mean == pytest.approx(0.25) and lo == pytest.approx(0.25) and hi == pytest.approx(0.25)
    assert report.paired_ci(a, b, ids=["0", "1"])[0] == pytest.approx(0.25)  # restricted to some questions
    assert report.paired_ci({"x": 1.0, **a}, b) == pytest.approx((0.25, 0.25, 0.25))  # only questions both have


def test_the_report_tables_paired_differences_overall_and_for_compositional(report, tmp_path):
    types = ["compositional", "compositional", "comparison", "comparison"]
    flat, coda = [0.0, 0.5, 0.25, 1.0], [0.25, 0.75, 0.5, 1.0]  # coda − flat: 0.25, 0.25, 0.25, 0.0
    doc = {
        "config": {"train_s": 600, "warm_steps": 10},
        "runs": {
            "2wiki/flat/0": _run(flat, 600, types),
            "2wiki/flat/1": _run(flat, 600, types),
            "2wiki/coda/0": _run(coda, 600, types),
        },
    }
    lines = report.paired_table(doc, "2wiki")
    (row,) = [line for line in lines if line.startswith("| coda − flat |")]
    assert row.endswith("| +0.250 [+0.250, +0.250] (n=2) |")  # the compositional pair: both +0.25
    assert "| +0.188 [" in row and "(n=4) |" in row  # overall (0.25 · 3 + 0) / 4
    assert not any(line.startswith("| coda − coda-sft") for line in lines)  # not measured: no row


@pytest.fixture(scope="module")
def qa():
    from bench import qa

    return qa


def test_every_arm_has_its_recipe_training_and_environment(qa):
    expected = {  # arm: (recipe stem for 2wiki, the recipe's agent, training, environment)
        "zero-shot": ("smol-2wiki", "search-r1", None, {}),
        "naive-rag": ("smol-2wiki", "search-r1", None, {"CODA_ROLLOUT_AGENT": "naive-rag"}),
        "naive-rag-4shot": ("smol-2wiki", "search-r1", None, {"CODA_ROLLOUT_AGENT": "naive-rag"}),
        "sft": ("smol-2wiki", "search-r1", "sft", {}),
        "rag-sft": ("smol-2wiki", "search-r1", "sft", {"CODA_ROLLOUT_AGENT": "naive-rag"}),
        "flat": ("smol-2wiki", "search-r1", "rl", {}),
        "coda-sft": ("smol-coda-2wiki", "coda", "sft", {}),
        "coda": ("smol-coda-2wiki", "coda", "rl", {}),
        "coda-shared": (
            "smol-coda-2wiki",
            "coda",
            "rl",
            {"CODA_ROLLOUT_CODA__REWARD_MODE": "shared", "CODA_TRAINER_ROLE_BASELINE": "inherit"},
        ),
        "thinker-searcher": ("smol-thinker-2wiki", "thinker-searcher", "rl", {}),
        "rft": ("smol-2wiki", "search-r1", "rl", {"CODA_TRAINER_ADVANTAGE": "rft"}),
        "coda-rft": (
            "smol-coda-2wiki",
            "coda",
            "rl",
            {"CODA_TRAINER_ADVANTAGE": "rft", "CODA_TRAINER_RFT_THRESHOLD": "0"},
        ),
    }
    from bench._qa_arms import METHODS

    assert list(qa.ARMS) == list(expected) == list(METHODS)
    for name, (stem, agent, training, env) in expected.items():
        arm = qa.ARMS[name]
        assert (arm.training, arm.env) == (training, env), name
        for dataset in qa.DATASETS:
            recipe = qa.recipe_of(dataset, name)
            assert recipe.endswith(f"/{stem.replace('2wiki', dataset)}.toml"), (name, dataset)
            assert qa.RolloutSettings.load(recipe).agent == agent, (name, dataset)
            qa.check_env(recipe, arm.env)  # every variable is a real setting with a valid value
    assert set(qa.TRAINED) == {n for n, e in expected.items() if e[2]}


def test_an_arms_environment_that_a_service_would_ignore_is_refused(qa):
    recipe = qa.recipe_of("2wiki", "coda")
    with pytest.raises(SystemExit, match="no setting 'reward_mod'"):
        qa.check_env(recipe, {"CODA_ROLLOUT_REWARD_MOD": "shared"})
    with pytest.raises(SystemExit, match="no setting 'coda__reward_mod'"):
        qa.check_env(recipe, {"CODA_ROLLOUT_CODA__REWARD_MOD": "shared"})
    with pytest.raises(SystemExit, match="no setting 'reward_mode'"):  # the flat spelling went a release ago
        qa.check_env(recipe, {"CODA_ROLLOUT_REWARD_MODE": "shared"})
    with pytest.raises(SystemExit, match="refuses"):
        qa.check_env(recipe, {"CODA_ROLLOUT_CODA__REWARD_MODE": "shraed"})
    with pytest.raises(SystemExit, match="refuses"):
        qa.check_env(recipe, {"CODA_TRAINER_ROLE_BASELINE": "shraed"})


def test_the_thinkers_searcher_is_the_source_arms_last_adapter(qa, tmp_path):
    weights = tmp_path / "2wiki" / "coda-sft-seed1" / "weights"
    for name in ("policy-v3", "policy-v12", "policy-v13.tmp"):
        (weights / name).mkdir(parents=True)
        (weights / name / "adapter_config.json").write_text("{}")
    (weights / "policy-v14").mkdir()  # no adapter in it (a folder being written)
    assert qa.searcher_adapter(tmp_path, "2wiki", "coda-sft", 1) == weights / "policy-v12"
    with pytest.raises(RuntimeError, match="--methods coda-sft --seeds 0"):
        qa.searcher_adapter(tmp_path, "2wiki", "coda-sft", 0)


def test_a_thinker_runs_after_the_arm_its_searcher_comes_from(qa, tmp_path, monkeypatch):
    import argparse

    order = []
    row = {"id": "q", "type": "bridge", "em": 0.0, "f1": 0.0, "searches": 0, "tokens": 0, "hit": None}

    def fake(method):
        return lambda self, dataset, m, *seed: order.append((m, *seed)) or {"rows": [row], "train_s": 1.0}

    monkeypatch.setattr(qa, "RESULTS", tmp_path)
    monkeypatch.setattr(qa.Bench, "trained", fake("trained"))
    monkeypatch.setattr(qa.Bench, "untrained", fake("untrained"))
    args = argparse.Namespace(
        root=str(tmp_path / "runs"), name="t", fresh=False, again=False, train_s=1.0, warm_steps=1, limit=0,
        seeds=[0, 1], searcher="coda-sft", datasets=["2wiki"], methods=["thinker-searcher", "zero-shot", "coda-sft"],
        set=[], curve=False,
    )  # fmt: skip
    qa.Bench(args).run()
    # Seed 1 runs the arms in reverse order (the machine's speed drifts over a day), the thinker still last.
    assert order == [("zero-shot",), ("coda-sft", 0), ("thinker-searcher", 0), ("coda-sft", 1), ("thinker-searcher", 1)]
    from bench import _results

    assert "2wiki/thinker-searcher/1" in _results.read("t", tmp_path)["runs"]


def test_a_coda_run_records_its_reward_and_the_report_names_it(qa, report, monkeypatch):
    for key in [k for k in os.environ if k.startswith("CODA_")]:
        monkeypatch.delenv(key)
    coda, shared = qa.ARMS["coda"], qa.ARMS["coda-shared"]
    assert qa.coda_reward(qa.recipe_of("2wiki", "coda"), coda.env) == "per_role / per_role"  # the recipes' default
    assert qa.coda_reward(qa.recipe_of("2wiki", "coda-shared"), shared.env) == "shared / inherit"
    doc = {"runs": {"2wiki/coda/0": _run([0.5]), "2wiki/coda/1": {**_run([0.5]), "reward": "per_role / per_role"}}}
    (line,) = [line for line in report.rewards(doc, "2wiki") if line]
    assert (
        "coda: shared / inherit (recorded before the bench noted it) (seeds 0), per_role / per_role (seeds 1)" in line
    )


def test_raw_results_are_written_compressed_and_read_back(tmp_path):
    from bench import _results

    doc = {"runs": {"2wiki/sft/0": {"rows": [{"id": "q1", "f1": 0.5}] * 50}}}
    (tmp_path / "qa.json").write_text("{}")  # a plain file from before: read only while no .json.xz exists
    assert _results.read("qa", tmp_path) == {}
    path = _results.write(doc, "qa", tmp_path)
    assert path.name == "qa.json.xz" and not (tmp_path / "qa.json").exists()
    assert _results.read("qa", tmp_path) == doc and _results.read("other", tmp_path) is None


# ---------------------------------------------------------------- the baselines a reviewer asks for first
def test_few_shot_examples_are_training_questions_one_of_each_type():
    from agents.datasets import load_prompts, question_type, select_split
    from bench import qa

    records = load_prompts(qa.DATASETS["2wiki"])
    held_out = {r.question for r in select_split(records, "eval")}
    text = qa.few_shot_prompt("2wiki", 4)
    shown = [line.removeprefix("Question: ") for line in text.splitlines() if line.startswith("Question: ")]
    assert len(shown) == 4 and not set(shown) & held_out
    assert len({question_type(r) for r in records if r.question in shown}) == 4
    first = next(r for r in records if r.question == shown[0])
    assert f"Question: {shown[0]}\nAnswer: {first.golden_answers[0]}" in text


def test_an_arm_that_names_another_agent_gets_that_agents_demonstrations(monkeypatch, tmp_path):
    """rag-sft trains naive RAG on demonstrations of its own one turn: the stack reads the agent as its services
    will (the arm's CODA_ROLLOUT_AGENT over the recipe), and the arm's environment does not leak out."""
    from bench import qa

    monkeypatch.delenv("CODA_ROLLOUT_AGENT", raising=False)
    runner = qa.Bench.__new__(qa.Bench)
    stack = runner.stack("2wiki", "rag-sft", tmp_path / "run")
    assert stack.agent == "naive-rag" and stack.demonstrations == "rag"
    assert "CODA_ROLLOUT_AGENT" not in os.environ
    assert runner.stack("2wiki", "sft", tmp_path / "run2").demonstrations == "search"


def test_a_page_says_the_commands_that_measure_its_runs_again(report):
    """One command per set of --set settings its runs had, each with the page's name, datasets, methods, seeds."""
    doc = {
        "config": {"train_s": 1800.0, "warm_steps": 60, "limit": 100, "seeds": [0]},
        "runs": {
            "2wiki/naive-rag": {"commit": "d05a8fe"},
            "2wiki/flat/0": {"commit": "d05a8fe"},
            "2wiki/coda/0": {"commit": "2504d59 CODA_TRAINER_ADVANTAGE=dr_grpo"},
            "2wiki/coda/1": {"commit": "2504d59 CODA_TRAINER_ADVANTAGE=dr_grpo"},
        },
    }
    assert report.reproduce_commands(doc, "qa-x") == [
        ".venv/bin/python -m bench.qa --name qa-x --datasets 2wiki --methods naive-rag flat --seeds 0 "
        "--train-s 1800 --warm-steps 60 --limit 100",
        ".venv/bin/python -m bench.qa --name qa-x --datasets 2wiki --methods coda --seeds 0 1 "
        "--train-s 1800 --warm-steps 60 --limit 100 --set CODA_TRAINER_ADVANTAGE=dr_grpo",
    ]
