"""PECO: CoDA's reward per role. The planner is judged by what it controls, each executor by its own task.

CoDA's shared reward (``formulas.coda_reward``) gives every executor the planner's final-answer score, so an
executor that found the bridge entity is punished when hop 2 fails, its ``<refine>`` is checked against the
final gold it never saw, and format credit is paid for empty tags. Here, with the question's hop plan
(``agents.plans``: each sub-question and its expected answers; none for held-out or unplanned questions):

- executor e, delegated task t_e, answered a_e: its target T_e is the answers of the plan's sub-question that
  t_e matches (``match_subquestion``: token F1 ≥ ``TASK_MATCH``, and closer than to the question), else the
  question's golds;
  ``R_e = (6·F1(a_e, T_e) − 3) + w_fmt·fmt_e + w_ref·refine_e`` with ``refine_e`` = cover-EM of its own
  ``<refine>`` text against T_e.
- planner: ``R_p = (6·s − 3) + w_fact·facts_obtained − w_restate·(restated + repeated) + w_fmt·fmt_p``, s = the metric
  score of its final answer; ``facts_obtained`` = the fraction of the plan's sub-questions whose answers some
  executor returned (F1 > ``FACT_FOUND``; 0 without a plan), ``restated`` = the fraction of its tasks that
  restate the question (``restates``: F1 ≥ ``RESTATES`` and every word of it; 0 without tasks), ``repeated``
  the fraction that ask again what an earlier task of the episode asked (the same normalised text): neither
  asks for anything new, and a warm-started planner with turns to spare delegated its last task again and
  again (held out, 3.5 tasks a question where the plans have 2). Such tasks run no executor of their own
  (``agents.coda.run_coda`` answers them from the episode's earlier answers) yet still count here.
- ``fmt`` is ``format.nonempty_role_format_score``: a tag counts only if every block of it has content.

Pure functions over strings; the plan comes in as an argument (``agents.coda`` looks it up), so these do not
depend on how plans are read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agents.answers import AnswerMetric, affine_answer_reward, answer_reward, as_gold_list, normalize_answer, token_f1
from agents.core.episode import RewardResult
from agents.core.turns import nonempty_role_format_score
from agents.rewards.retrieval import information_reverse_rank, refine_score

if TYPE_CHECKING:
    from agents.plans import SubQuestion

# A task with this token F1 against the question, holding every word of it, delegates it whole
# (``restates``; bench/_qa_report.py counts them the same way).
RESTATES = 0.8
# A task is about a sub-question when their token F1 is at least this and no lower than the task's with the
# question itself; the closest sub-question wins. 0.5: a paraphrase that keeps the entity and the relation clears
# it ("Who is the director of Red Kite?" vs "Who directed Red Kite?": 0.6), a task with neither in common does
# not. Only the closest counts because templated questions share words: a comparison's "When was Red Kite
# released?" has 0.6 with "When was Blue Heron released?" too, and 1.0 with its own. The question competes
# because it can clear the bar ("Where was the director of film Red Kite born?" has 0.67 with "Who is the
# director of film Red Kite?"): a task that asks the whole question is judged by the golds it asked for.
TASK_MATCH = 0.5
# An executor's answer obtained a sub-question's fact when its token F1 against the answers is ABOVE this:
# a part of the name that is all right counts ("Tomas" for "Tomas Vale": 0.67), a two-token name with one
# token wrong does not ("Tomas Reis": exactly 0.5), as a fact term paid whole must not pay for a wrong entity.
FACT_FOUND = 0.5


@dataclass(frozen=True)
class ExecutorTurns:
    """What the per-role reward reads of one executor: the task it was given, the answer it returned ('' for
    none), its own turns (``TokenTrajectory.generated_text``) and its sample id, which names its reward."""

    sample_id: str
    task: str
    answer: str
    generated: str
    documents: Sequence[str] = ()  # its <documents> contents, for the logged information reverse-rank


def match_subquestion(task: str, subquestions: Sequence[SubQuestion], question: str = "") -> int | None:
    """Index of the sub-question whose task text is closest to ``task`` (token F1; the first on a tie), or None
    when even that one is below ``TASK_MATCH`` or ``task`` is closer to the ``question`` itself."""
    scores = [token_f1(task, sq.task) for sq in subquestions]
    if not scores or max(scores) < TASK_MATCH or max(scores) < token_f1(task, question):
        return None
    return scores.index(max(scores))


def executor_target(
    task: str, subquestions: Sequence[SubQuestion], question: str, golds: Iterable[str]
) -> tuple[list[str], bool]:
    """What the executor of ``task`` should have returned: its sub-question's answers (``matched`` True), else
    the golds."""
    j = match_subquestion(task, subquestions, question)
    return (list(subquestions[j].answers), True) if j is not None else (as_gold_list(golds), False)


def executor_reward(
    run: ExecutorTurns,
    subquestions: Sequence[SubQuestion],
    question: str,
    golds: str | Iterable[str],
    *,
    format_weight: float = 0.1,
    refine_weight: float = 0.1,
) -> RewardResult:
    """``R_e = (6·s_e − 3) + format_weight·fmt_e + refine_weight·refine_e`` (module docstring); in [−3, 3.2] at the
    default weights.

    Components are named ``executor_*`` so that they do not mix with the planner's ``f1``/``answer`` in
    per-sample averages (RED's accuracy and the dashboards read those).
    """
    target, matched = executor_target(run.task, subquestions, question, as_gold_list(golds))
    score = token_f1(run.answer, target)
    fmt = nonempty_role_format_score(run.generated, "executor")
    refine = refine_score(run.generated, target)
    reward = affine_answer_reward(score) + format_weight * fmt + refine_weight * refine
    components = {
        "executor_score": score,
        "executor_matched": float(matched),
        "executor_format": fmt,
        "executor_refine": refine,
    }
    return RewardResult(reward=reward, components=components)


def facts_obtained(subquestions: Sequence[SubQuestion], executor_answers: Sequence[str]) -> float:
    """Fraction of ``subquestions`` whose answers some executor's answer matches (token F1 > ``FACT_FOUND``),
    whichever task that executor was given; 0.0 with no sub-questions."""
    if not subquestions:
        return 0.0
    found = sum(any(token_f1(a, sq.answers) > FACT_FOUND for a in executor_answers) for sq in subquestions)
    return found / len(subquestions)


def restates(task: str, question: str) -> bool:
    """True when ``task`` asks the whole ``question``: token F1 ≥ ``RESTATES`` and every (normalised) word of the
    question in it. F1 alone is not enough: a kinship sub-question about a long name shares nearly every token
    with its question ("Who is the father of Jan III of Oświęcim?" has F1 0.82 with "Who is the paternal
    grandfather of Jan III of Oświęcim?") yet asks one hop of it, not all of it."""
    words = set(normalize_answer(task).split())
    asked = normalize_answer(question).split()
    return bool(asked) and all(w in words for w in asked) and token_f1(task, question) >= RESTATES


def repeated_fraction(tasks: Sequence[str]) -> float:
    """Fraction of ``tasks`` whose normalised text is an earlier task's; 0.0 with no tasks."""
    seen: set[str] = set()
    repeats = 0
    for task in tasks:
        key = normalize_answer(task)
        repeats += key in seen
        seen.add(key)
    return repeats / len(tasks) if tasks else 0.0


def restated_fraction(tasks: Sequence[str], question: str) -> float:
    """Fraction of ``tasks`` that restate ``question`` (``restates``); 0.0 with no tasks."""
    return sum(restates(t, question) for t in tasks) / len(tasks) if tasks else 0.0


def planner_reward(
    answer: str | None,
    planner_generated: str,
    tasks: Sequence[str],
    executor_answers: Sequence[str],
    question: str,
    golds: str | Iterable[str],
    subquestions: Sequence[SubQuestion],
    *,
    metric: AnswerMetric = "f1",
    format_weight: float = 0.1,
    fact_weight: float = 1.0,
    restate_penalty: float = 1.0,
) -> RewardResult:
    """``R_p = (6·s − 3) + fact_weight·facts_obtained − restate_penalty·(restated + repeated) +
    format_weight·fmt_p``.

    ``s`` is the ``metric`` score of the final ``answer`` (0 when ``None``). Components keep
    ``answer_reward``'s names (``em``, ``f1``, …, ``has_answer``) and ``answer``/``answer_term`` as
    ``coda_reward`` has them, so eval tables and RED's accuracy read the same keys in either reward mode.
    """
    golds = as_gold_list(golds)
    scores = answer_reward(answer, golds).components
    s = scores[metric]
    facts = facts_obtained(subquestions, executor_answers)
    restated = restated_fraction(tasks, question)
    repeated = repeated_fraction(tasks)
    fmt = nonempty_role_format_score(planner_generated, "planner")
    answer_term = affine_answer_reward(s)
    reward = answer_term + fact_weight * facts - restate_penalty * (restated + repeated) + format_weight * fmt
    components = {
        "answer": s,
        "answer_term": answer_term,
        **scores,
        "planner_format": fmt,
        "facts_obtained": facts,
        "restated": restated,
        "repeated": repeated,
        "has_plan": float(bool(subquestions)),
    }
    return RewardResult(reward=reward, components=components)


def peco_reward(
    answer: str | None,
    planner_generated: str,
    executors: Sequence[ExecutorTurns],
    question: str,
    golds: str | Iterable[str],
    subquestions: Sequence[SubQuestion],
    *,
    metric: AnswerMetric = "f1",
    format_weight: float = 0.1,
    refine_weight: float = 0.1,
    fact_weight: float = 1.0,
    restate_penalty: float = 1.0,
    tasks: Sequence[str] | None = None,
    executor_answers: Sequence[str] | None = None,
) -> RewardResult:
    """The episode's reward is the planner's (``planner_reward``), with the executors' means added to its
    components; ``per_trajectory`` holds each executor's ``executor_reward`` under its sample id (the planner
    takes the episode's).

    ``tasks`` and ``executor_answers``: every task the planner delegated and the answer it got, those answered
    from what the episode already knew without an executor included (``agents.coda.run_coda``), so a repeated
    or restated task still counts against the planner; default: the executors' own."""
    golds = as_gold_list(golds)
    planner = planner_reward(
        answer,
        planner_generated,
        [e.task for e in executors] if tasks is None else tasks,
        [e.answer for e in executors] if executor_answers is None else executor_answers,
        question,
        golds,
        subquestions,
        metric=metric,
        format_weight=format_weight,
        fact_weight=fact_weight,
        restate_penalty=restate_penalty,
    )
    own = {
        e.sample_id: executor_reward(
            e, subquestions, question, golds, format_weight=format_weight, refine_weight=refine_weight
        )
        for e in executors
    }
    components = {
        **planner.components,
        **{f"{k}_mean": _mean(r.components[k] for r in own.values()) for k in _EXECUTOR_MEANS},
        "information_reverse_rank": max((information_reverse_rank(e.documents, golds) for e in executors), default=0.0),
        "num_executors": float(len(executors)),
    }
    return RewardResult(reward=planner.reward, components=components, per_trajectory=own)


# The executor components whose mean over the episode's executors the episode logs (0 with no executor).
_EXECUTOR_MEANS = ("executor_score", "executor_matched", "executor_format", "executor_refine")


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0
