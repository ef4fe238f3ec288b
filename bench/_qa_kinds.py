"""Open and choice questions in the QA report: each question's kind, F1 per kind, the reading-free baseline, and
the targets (the bench's bar is on open-answer F1).

Half of 2Wiki's questions are choices (yes/no, or an answer the question names), where picking a candidate without
reading scores about 0.5; the report therefore leads with F1 on the *open* questions and shows the choice F1 next to
what ``agents.question_kinds.guess`` scores on the same questions. The kind is ``agents.question_kinds``'s, never
redefined here: a row's own ``kind`` (the eval records it since the kinds existed), else the rule applied to the
bundled question and golds the row's id names (rows carry neither the question nor its golds).

The functions that score arms use the report's statistics (``bench._qa_stats``) and borrow a few of the report's
own helpers (``bench._qa_report``) at call time: the report imports this module at its top, so importing it back
at ours would find it half made.
"""

from __future__ import annotations

from functools import cache

from bench._qa_arms import DATASETS, METHODS
from bench._qa_stats import _common, _fmt_ci, _runs, bootstrap_ci, paired_ci, per_question

OPEN, CHOICE = "open", "choice"


@cache
def lookup(dataset: str) -> dict[str, tuple[str, list[str]]]:
    """``prompt id -> (question, golds)`` of a bench dataset, read once per process (the report asks per table).
    Empty when the dataset cannot be loaded (the report alone, without the project's data)."""
    source = DATASETS.get(dataset, "")
    if not source.startswith("bundled:"):
        return {}
    try:
        from agents.datasets import load_bundled
    except ImportError:
        return {}
    return {r.prompt_id: (r.question, list(r.golden_answers)) for r in load_bundled(source.split(":", 1)[1])}


def kinds(dataset: str, runs: list[dict]) -> dict[str, str]:
    """``question id -> "open" | "choice"`` over the runs' rows; a question neither a row nor the dataset can
    classify is left out (it counts in no kind's F1)."""
    from agents.question_kinds import question_kind

    known = lookup(dataset)
    out: dict[str, str] = {}
    for run in runs:
        for row in run["rows"]:
            qid = row["id"]
            if qid in out:
                continue
            if row.get("kind") in (OPEN, CHOICE):
                out[qid] = row["kind"]
            elif qid in known:
                out[qid] = question_kind(*known[qid])
    return out


def of_kind(kind_of: dict[str, str], ids, kind: str) -> list[str]:
    """The ids among ``ids`` of one kind, sorted (the bootstrap draws over a fixed order)."""
    return sorted(q for q in ids if kind_of.get(q) == kind)


def guess_scores(dataset: str, ids) -> dict[str, float]:
    """The reading-free baseline per question: token F1 of ``guess(question)`` against the golds (the best over
    the golds, as the eval scores an answer), for the ``ids`` the dataset knows."""
    from agents.answers import token_f1
    from agents.question_kinds import guess

    known = lookup(dataset)
    return {q: token_f1(guess(known[q][0]), known[q][1]) for q in ids if q in known}


# The bar, all on open-answer F1 (choices can be half won without reading): an RL arm beats its own SFT-only arm by
# RL_MARGIN with the paired interval above 0; the best arm reaches TARGET_OPEN_F1 and RAG + SFT + RAG_MARGIN; the
# flat agent reads 2Wiki's compositional questions (the ones it scored ~0 on) to TARGET_COMPOSITIONAL.
RL_OVER_SFT = (("flat", "sft"), ("coda", "coda-sft"))
RL_MARGIN = 0.05
TARGET_OPEN_F1 = 0.30
RAG_RIVAL, RAG_MARGIN = "rag-sft", 0.05
TARGET_COMPOSITIONAL = {"2wiki": 0.10}


def kind_ci(runs: list[dict], kind_of: dict[str, str], kind: str) -> tuple[float, float, float]:
    """F1 over the questions of one kind (each question's F1 averaged over the seeds) and its interval."""

    f1 = per_question(runs, "f1")
    return bootstrap_ci([f1[q] for q in of_kind(kind_of, f1, kind)])


def counts(ids, kind_of: dict[str, str]) -> str:
    """``100: 52 open, 48 choice`` (and how many the kinds could not be told for, if any)."""
    ids = list(ids)
    n_open, n_choice = len(of_kind(kind_of, ids, OPEN)), len(of_kind(kind_of, ids, CHOICE))
    unknown = len(ids) - n_open - n_choice
    return f"{len(ids)}: {n_open} open, {n_choice} choice" + (f", {unknown} unknown" if unknown else "")


def choice_baseline(doc: dict, dataset: str) -> tuple[tuple[float, float, float], list[str]] | None:
    """The reading-free baseline's choice F1 [95% CI] on the choice questions the arms were evaluated on, and
    those questions; None when none of them can be looked up."""

    runs = _common(doc, dataset)
    if not runs:
        return None
    scores = guess_scores(dataset, of_kind(kinds(dataset, runs), (row["id"] for row in runs[0]["rows"]), CHOICE))
    if not scores:
        return None
    return bootstrap_ci([scores[q] for q in sorted(scores)]), sorted(scores)


def baseline_row(ci: tuple[float, float, float], ids: list[str]) -> str:
    """The baseline's row in the main table: no runs, no open questions, nothing trained."""

    return (
        f"| reading-free choice baseline: `guess(question)` | – | {len(ids)} choice | – | {_fmt_ci(ci)} | "
        + "– | " * 11
        + "– |"
    )


def below_baseline(doc: dict, dataset: str, baseline: float) -> list[str]:
    """The line under the main table naming the arms whose choice F1 a reader of nothing beats."""

    below = []
    for method in METHODS:
        if runs := _runs(doc, dataset, method):
            choice = kind_ci(runs, kinds(dataset, runs), CHOICE)[0]
            if choice < baseline:
                below.append(f"{METHODS[method]} ({choice:.3f})")
    if not below:
        return ["", f"Every arm's choice F1 is at or above the reading-free baseline ({baseline:.3f})."]
    return [
        "",
        f"↓ below the reading-free baseline ({baseline:.3f}) on the choice questions: " + "; ".join(below) + ".",
    ]


def type_kind(ids: set[str], kind_of: dict[str, str]) -> str:
    """A type's header note: ``open, n=36`` when all its questions are of one kind (2Wiki's types split cleanly),
    else the counts (HotpotQA's bridge questions include some choices, by the rule per question)."""
    n_open, n_choice = len(of_kind(kind_of, ids, OPEN)), len(of_kind(kind_of, ids, CHOICE))
    if n_open == len(ids):
        return f"open, n={len(ids)}"
    if n_choice == len(ids):
        return f"choice, n={len(ids)}"
    return f"n={len(ids)}: {n_open} open, {n_choice} choice"


def targets(doc: dict, dataset: str) -> list[str]:
    """The benchmark's bar on open-answer F1 (``RL_OVER_SFT``, ``TARGET_OPEN_F1``, ``RAG_RIVAL``,
    ``TARGET_COMPOSITIONAL``), each line "met", "not met" or "not measured"."""
    from bench._qa_report import _current_types, _fmt_diff, _row_type

    measured = {m: runs for m in METHODS if (runs := _runs(doc, dataset, m))}
    kind_of = kinds(dataset, _common(doc, dataset))
    f1 = {m: per_question(runs, "f1") for m, runs in measured.items()}
    open_f1 = {m: bootstrap_ci([f1[m][q] for q in of_kind(kind_of, f1[m], OPEN)]) for m in measured}
    lines = []
    for rl, sft in RL_OVER_SFT:
        what = f"{rl} − {sft} (RL over its own SFT only)"
        if rl not in f1 or sft not in f1:
            missing = " and ".join(m for m in (rl, sft) if m not in f1)
            lines.append(f"- {what}: not measured ({missing} not run)")
            continue
        ids = of_kind(kind_of, set(f1[rl]) & set(f1[sft]), OPEN)
        gap, lo, hi = paired_ci(f1[rl], f1[sft], ids)
        ok = bool(ids) and gap >= RL_MARGIN and lo > 0
        lines.append(
            f"- {what}: open-answer F1 {_fmt_diff((gap, lo, hi), len(ids))} → {'met' if ok else 'not met'} "
            f"(bar: ≥ +{RL_MARGIN:.2f}, paired interval above 0)"
        )
    rivals = [m for m in open_f1 if m != RAG_RIVAL and open_f1[m][0] == open_f1[m][0]]
    if not rivals:
        lines.append("- best arm's open-answer F1: not measured")
    else:
        best = max(rivals, key=lambda m: open_f1[m][0])
        score = open_f1[best][0]
        reached = score >= TARGET_OPEN_F1
        line = f"- best arm's open-answer F1, {METHODS[best]}: {score:.3f} (bar: ≥ {TARGET_OPEN_F1:.2f}"
        if RAG_RIVAL in open_f1:
            rag = open_f1[RAG_RIVAL][0]
            line += f" and ≥ {RAG_RIVAL} {rag:.3f} + {RAG_MARGIN:.2f}) → "
            line += "met" if reached and score >= rag + RAG_MARGIN else "not met"
        else:
            line += f"; {RAG_RIVAL} not measured) → " + ("the bar's first half met" if reached else "not met")
        lines.append(line)
    if dataset in TARGET_COMPOSITIONAL:
        bar = TARGET_COMPOSITIONAL[dataset]
        if "flat" not in f1:
            lines.append("- flat arm's compositional F1: not measured")
        else:
            today = _current_types(dataset)
            ids = sorted(q for q in f1["flat"] if today.get(q, _row_type(doc, dataset, q)) == "compositional")
            score = bootstrap_ci([f1["flat"][q] for q in ids])
            lines.append(
                f"- flat arm's compositional F1: {_fmt_ci(score)} (n={len(ids)}) → "
                f"{'met' if ids and score[0] >= bar else 'not met'} (bar: ≥ {bar:.2f})"
            )
    return lines
