"""What a CoDA episode made of its question, from the eval rows ``qa.json`` keeps: its delegations, each hop's
sub-answer F1 against the question's hop plan, and the split statistics of a set of rows (``bench._qa_report``
tables them per run and per question type)."""

from __future__ import annotations

from collections.abc import Sequence

from agents.rewards.peco import restates  # a CoDA task that asks the whole question
from bench._qa_arms import DATASETS

HOP1_RIGHT = 0.5  # a first hop's F1 from which it counts as right (its answer names the bridge entity)


def mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def delegations(row: dict, expected: Sequence[Sequence[str]] | None = None) -> dict:
    """What ``qa.json`` keeps of a CoDA episode's split of its question (``{}`` for other agents, from an eval
    row's ``facts``): the tasks the planner delegated, how many restate the question (no decomposition), the
    best F1 an executor's answer had against the gold answers, whether the final answer is an executor's, how
    many executors answered nothing, whether the final answer is the last delegation's answer
    (``passed_on_last``), whether task 2 builds on task 1's result (``chained``: it contains task
    1's executor answer, both normalised, the answer not empty; None with fewer than two tasks), and, given the
    question's hop plan (``expected``: per delegation of ``agents.plans.plan``, the answers its sub-question
    expects; ``expected_results``), the sub-answer F1 of each hop (``hop_f1``)."""
    from agents.answers import normalize_answer, token_f1  # the project's scoring; the report alone needs none

    facts = row.get("facts") or {}
    if "tasks" not in facts:
        return {}
    tasks, said = facts["tasks"], [a or "" for a in facts["executor_answers"]]
    answers = [a for a in said if a]
    final = normalize_answer(row.get("prediction") or "")
    first = normalize_answer(said[0]) if said else ""
    return {
        "tasks": len(tasks),
        "restated": sum(restates(task, row["question"]) for task in tasks),
        "executor_f1": max((token_f1(a, row["golden_answers"]) for a in answers), default=0.0),
        "passed_on": bool(final) and any(normalize_answer(a) == final for a in answers),
        # The last delegation's answer passed on word for word: what a bridge's planner should answer with.
        "passed_on_last": bool(final) and bool(said) and normalize_answer(said[-1]) == final,
        "empty_answers": sum(not a.strip() for a in said),
        "chained": (bool(first) and f" {first} " in f" {normalize_answer(tasks[1])} ") if len(tasks) >= 2 else None,
        **hop_f1(said, expected),
    }


def hop_f1(said: Sequence[str], expected: Sequence[Sequence[str]] | None) -> dict:
    """Each executor's answer against the sub-question its plan expects at the same delegation index (token F1,
    the best over that sub-question's answers; a delegation the planner never made scores 0). Hop 1 is the
    first half of the plan's sub-questions, hop 2 the second half: a bridge's two hops; a comparison's first
    and second compared entity; a bridge_comparison's four (both entities' first hops, then both second hops)
    averaged two by two. ``planned``: the plan's sub-questions (0: no plan, no hop F1)."""
    from agents.answers import token_f1

    if not expected:
        return {"planned": 0, "hop1_f1": None, "hop2_f1": None}
    f1 = [token_f1(said[i], list(answers)) if i < len(said) else 0.0 for i, answers in enumerate(expected)]
    half = len(f1) // 2 or 1
    return {"planned": len(f1), "hop1_f1": sum(f1[:half]) / half, "hop2_f1": mean(f1[half:])}


def expected_results(dataset: str) -> dict[str, list[tuple[str, ...]]]:
    """Each held-out question's hop plan (``agents.plans.plan`` over its annotations), as the answers each
    delegation should return, by question id; questions without a plan (or without sub-questions) are absent.
    Only to measure an eval: no training path reads a held-out question's annotations."""
    from agents.datasets import HELDOUT, load_prompts
    from agents.plans import plan

    out = {}
    for r in load_prompts(DATASETS[dataset]):
        if r.split != HELDOUT:
            continue
        found = plan({"question": r.question, "golden_answers": list(r.golden_answers), "metadata": r.metadata})
        if found is not None and found.tasks:
            out[r.prompt_id] = [tuple(sq.answers) for sq in found.tasks]
    return out


def _share(flags) -> str:
    flags = list(flags)
    return f"{sum(flags) / len(flags):.0%}" if flags else "–"


def hierarchy_stats(rows: list[dict]) -> dict:
    """How a CoDA arm's planner split these rows' questions (rows of ``delegations`` with a hop plan's fields):
    tasks per question; the share of questions split into two or more tasks; the share of tasks restating the
    question; of the split questions, the share whose task 2 builds on task 1's answer; hop-1 and hop-2
    sub-answer F1 over the questions with a plan (``planned``: how many; ``plan_tasks``: their plans' sub-questions
    per question), and hop 2's where hop 1 was right (F1 >= ``HOP1_RIGHT``; ``hop1_right``: how many); the share of
    executors that answered nothing; the share of final answers that are the last delegation's answer; the final
    answer's F1. None where nothing was there to count."""
    tasks = sum(row["tasks"] for row in rows)
    split = [row for row in rows if row["tasks"] >= 2]
    planned = [row for row in rows if row.get("hop1_f1") is not None]
    return {
        "questions": len(rows),
        "tasks_per_q": tasks / len(rows) if rows else None,
        "split": mean([float(row["tasks"] >= 2) for row in rows]),
        "restating": sum(row["restated"] for row in rows) / tasks if tasks else None,
        "chain": mean([float(bool(row["chained"])) for row in split]),
        "planned": len(planned),
        "hop1_f1": mean([row["hop1_f1"] for row in planned]),
        "hop2_f1": mean([row["hop2_f1"] for row in planned]),
        "plan_tasks": mean([row["planned"] for row in planned]),
        # Hop 2 where hop 1 found what the plan expects (F1 >= 0.5): the second executor's own share of the misses.
        "hop1_right": len(right := [row for row in planned if row["hop1_f1"] >= HOP1_RIGHT]),
        "hop2_f1_hop1_right": mean([row["hop2_f1"] for row in right]),
        "final_last": mean([float(row["passed_on_last"]) for row in rows if "passed_on_last" in row]),
        "empty": sum(row["empty_answers"] for row in rows) / tasks if tasks else None,
        "f1": mean([row["f1"] for row in rows]),
    }
