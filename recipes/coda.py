"""CoDA: a Planner delegates sub-questions to ephemeral Executors; one model plays both roles, both are trained
(``red-coda`` is the same agent: RED changes only the trainer's SFT weighting).

- Planner: writes ``<think>``, ``<task>`` (delegate) or ``<answer>``; receives ``<result>``.
- Executor: a fresh context per task (its system prompt + the task, nothing of the planner's history);
  writes ``<think>``, ``<search>``, ``<refine>``, ``<answer>``; receives ``<documents>``.
- Only the executor's ``<answer>`` text returns to the planner, as ``<result>``; an executor that runs out
  of turns without answering returns an empty result (as upstream CoDA does).
- Each executor is its own sample, ``parent_id`` = its planner's sample id.
- All tasks of one planner turn run concurrently.

Reward (``reward_mode``): ``per_role`` (the default, ``recipes.rewards.peco``) judges each role by what it
controls, reading the question's hop plan (``recipes.plans.plan_for_record``; none held out): each executor by
the F1 of its answer against the expected answer of the plan's sub-question its task matches (the golds when
none does or there is no plan), plus format and a refine term against that same target; the planner by
``(6·F1 − 3)`` of its final answer, plus the fraction of the plan's facts its executors returned, minus the
fraction of its tasks that restate the question or repeat an earlier task, plus format. Format pays only for tags with content. The
episode's reward and components (what eval and RED's accuracy read) are the planner's; each executor's own
reward goes to its sample (``RewardResult.per_trajectory``), so the trainer should give executors their own
baseline (``[trainer] role_baseline = "per_role"``: with ``inherit`` they copy the planner's advantage and
their rewards are only logged). ``shared`` is upstream CoDA's, the ablation arm: ``(6·F1 − 3)`` of the
planner's answer plus format and refine terms (``recipes.rewards.formulas.coda_reward``), one value for the
planner and every executor it spawned. The knobs: ``CoDAParams``.

Demonstrations (make-sft's ``coda`` format): per question, the executor's (``<search>`` → ``<documents>`` (mask
0) → ``<refine>`` quoting the retrieved sentence that holds the answer → ``<answer>``) and the planner's
(``<task>`` → ``<result>`` with the executor's answer (mask 0) → ``<answer>``), so co-training teaches the
format the CoDA loop runs (upstream CoDA's SFT data never used ``<task>``; ``docs/upstream.md``). With a hop plan
that knows what each hop asks (2Wiki's evidence triples, ``--hops supporting``) the planner delegates one
sub-question per hop, one per turn, each to its own executor whose documents hold that hop's expected result; a
question the data splits is never taught as a restated task. Otherwise the question is delegated whole.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import Field

from recipes.answers import normalize_answer
from recipes.base import Agent, AgentParams, Scoring, episode_reward
from recipes.core.context import AgentContext, Episode, RewardResult, SearchTrace, search_documents
from recipes.core.demonstrations import Demo, DemoFormat, Question, Search, Style, Writer, Written, assemble
from recipes.core.trajectory import TokenTrajectory
from recipes.core.turns import Action, Observation, RoleSpec, run_turns
from recipes.datasets import PromptRecord
from recipes.plans import HopPlan, plan_for_record
from recipes.prompts import INVALID_PLANNER_ACTION, INVALID_SEARCH_ACTION, executor_messages, planner_messages
from recipes.rewards.formulas import ExecutorRun, coda_reward
from recipes.rewards.peco import RESTATES, ExecutorTurns, peco_reward


class CoDAParams(AgentParams):
    """CoDA's own knobs, [rollout.coda] keys (coda and red-coda read them)."""

    table: ClassVar[str] = "coda"

    executor_max_turns: int = Field(3, ge=1, description="Action turns of each CoDA executor")
    format_weight: float = Field(0.1, description="CoDA format-term weight")
    refine_weight: float = Field(0.1, description="CoDA refine-term weight")
    reward_mode: Literal["per_role", "shared"] = Field(
        "per_role",
        description="per_role: each executor scored against its own sub-question, the planner by its final answer, "
        "the facts its executors found and the tasks that restate the question (set [trainer] role_baseline = "
        "'per_role' with it); shared: upstream CoDA's one reward for the planner and all its executors (ablation)",
    )
    # 1.0 each: a restated task costs the planner as much as a fact its executors found gains it.
    fact_weight: float = Field(
        1.0, description="per_role: planner bonus per fraction of the question's sub-question facts its executors found"
    )
    restate_penalty: float = Field(
        1.0,
        description=f"per_role: planner penalty per fraction of its tasks that restate the question (token F1 >= "
        f"{RESTATES} with it and all its words) or repeat an earlier task",
    )


@dataclass(frozen=True)
class CodaFacts:
    """The planner's delegations: each task and the answer its executor returned ('' for none), in order."""

    tasks: tuple[str, ...] = ()
    executor_answers: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExecutorResult:
    traj: TokenTrajectory
    answer: str  # '' when the executor ran out of turns without answering
    queries: list[str]
    retrieved: list[list[str]]


async def run_executor(ctx: AgentContext, task: str, parent_id: str) -> ExecutorResult:
    """One executor sub-episode."""
    traj = TokenTrajectory(ctx.tok.render(executor_messages(task)), role="executor", parent_id=parent_id)
    queries: list[str] = []
    retrieved: list[list[str]] = []

    async def act(actions: list[Action]) -> Observation:
        queries.append(actions[0].content)
        blocks, ids = await search_documents(ctx, [actions[0].content])
        retrieved.extend(ids)
        return Observation.wrapped("documents", blocks[0])

    spec = RoleSpec(
        actions=("search", "answer"),
        invalid_message=INVALID_SEARCH_ACTION,
        budget=ctx.budget("executor"),
        forced_final=True,
        env_frame=ctx.env_frame,
    )
    outcome = await run_turns(traj, ctx.policy, ctx.tok, spec, act)
    return ExecutorResult(traj, outcome.answer or "", queries, retrieved)


async def run_coda(ctx: AgentContext, record: PromptRecord) -> Episode:
    planner = TokenTrajectory(ctx.tok.render(planner_messages(record.question)), role="planner")
    episode = Episode(main=planner)
    tasks: list[str] = []
    executors: list[ExecutorResult] = []

    async def act(actions: list[Action]) -> Observation:
        turn = [a.content for a in actions]
        runs = await asyncio.gather(*(run_executor(ctx, t, planner.sample_id) for t in turn))
        tasks.extend(turn)
        executors.extend(runs)
        episode.children.extend(r.traj for r in runs)
        results = [r.answer.strip() for r in runs]
        # Several tasks in one turn: one <result> block each, in task order.
        before, after = Observation.wrapped("result", "").before, Observation.wrapped("result", "").after
        return Observation(content=(after + before).join(results), before=before, after=after, tag="result")

    spec = RoleSpec(
        actions=("task", "answer"),
        invalid_message=INVALID_PLANNER_ACTION,
        budget=ctx.budget("planner"),
        forced_final=True,
        env_frame=ctx.env_frame,
    )
    outcome = await run_turns(planner, ctx.policy, ctx.tok, spec, act)
    episode.answer = outcome.answer
    episode.invalid_turns = outcome.invalid_turns
    # The executors' searches, in delegation order: the episode's search trace (search metrics read it).
    episode.search = SearchTrace.of(
        [q for r in executors for q in r.queries], [ids for r in executors for ids in r.retrieved]
    )
    episode.facts = CodaFacts(tuple(tasks), tuple(r.answer for r in executors))
    return episode


@episode_reward
def reward(episode: Episode, scoring: Scoring) -> RewardResult:
    params = CoDAParams.of(scoring.settings)
    if params.reward_mode == "per_role":
        return per_role_reward(episode, scoring, params)
    executors = [ExecutorRun(c.generated_text, c.observations("documents")) for c in episode.children]
    return coda_reward(
        episode.answer,
        episode.main.generated_text,
        executors,
        scoring.record.golden_answers,
        metric=scoring.metric,
        format_weight=params.format_weight,
        refine_weight=params.refine_weight,
    )


def per_role_reward(episode: Episode, scoring: Scoring, params: CoDAParams) -> RewardResult:
    record = scoring.record
    plan = plan_for_record(record)
    facts = episode.facts if isinstance(episode.facts, CodaFacts) else None
    n = len(episode.children)
    # Facts are written by run_coda, one task and answer per executor in spawn order; an episode assembled
    # elsewhere (a test, a replay) may have none: its executors then have no task and no answer to score.
    tasks, answers = (facts.tasks, facts.executor_answers) if facts is not None else (("",) * n, ("",) * n)
    if not len(tasks) == len(answers) == n:
        raise ValueError(f"CoDA facts hold {len(tasks)} tasks and {len(answers)} answers for {n} executors")
    executors = [
        ExecutorTurns(c.sample_id, task, answer, c.generated_text, c.observations("documents"))
        for c, task, answer in zip(episode.children, tasks, answers, strict=True)
    ]
    return peco_reward(
        episode.answer,
        episode.main.generated_text,
        executors,
        record.question,
        record.golden_answers,
        plan.tasks if plan is not None else (),
        metric=scoring.metric,
        format_weight=params.format_weight,
        refine_weight=params.refine_weight,
        fact_weight=params.fact_weight,
        restate_penalty=params.restate_penalty,
    )


# ---------------------------------------------------------------- demonstrations
THOUGHTS = {
    "executor search": "I need to search for this.",
    "delegate": "One fact settles this; I will ask for it.",
    "delegate first": "I will ask for the first fact.",
    "delegate next": "I will ask for the next fact.",
    "conclude": "The helper found the answer.",
}


def evidence(passages: Sequence[str], answer: str, shown: str | None = None) -> str:
    """The retrieved sentence that contains the answer (else the first one), among those ``shown``."""
    sentences = [x.strip() for p in passages for x in re.split(r"(?<=[.!?])\s+|\n", p) if x.strip()]
    sentences = [x for x in sentences if shown is None or x in shown] or sentences
    for sentence in sentences:
        if answer.lower() in sentence.lower():
            return sentence
    return sentences[0] if sentences else ""


def executor_demonstration(tok, task: str, search: Search, answer: str, style: Style = Style()) -> Demo:
    """A CoDA executor: one search for its task, the sentence that answers it, the answer."""
    ids, shown = style.observation(tok, "documents", search.text)
    refine = evidence(search.passages, answer, shown)
    return assemble(
        tok,
        [
            (tok.render(executor_messages(task)), 0),
            (tok.encode(f"{style.thought(THOUGHTS['executor search'])}<search> {search.query} </search>"), 1),
            (ids, 0),
            (tok.encode(f"<refine> {refine} </refine>\n<answer> {answer} </answer>"), 1),
        ],
    )


def planner_demonstration(
    tok, question: str, delegations: Sequence[tuple[str, str]], gold: str, style: Style = Style()
) -> Demo:
    """A CoDA planner: each ``(task, its executor's answer)`` in its own turn (a rollout's turn ends at the first
    ``</task>``), then the answer."""
    pieces = [(tok.render(planner_messages(question)), 0)]
    for n, (task, result) in enumerate(delegations):
        key = "delegate" if len(delegations) == 1 else "delegate first" if n == 0 else "delegate next"
        pieces.append((tok.encode(f"{style.thought(THOUGHTS[key])}<task> {task} </task>"), 1))
        pieces.append((style.observation(tok, "result", result)[0], 0))
    pieces.append((tok.encode(f"{style.thought(THOUGHTS['conclude'])}<answer> {gold} </answer>"), 1))
    return assemble(tok, pieces)


def _delegations(w: Writer, q: Question) -> list[dict]:
    """An executor per sub-question whose documents hold its expected result (that result is its answer), then,
    when every sub-question's did, the planner that delegated them one per turn and answers the question with the
    last executor's answer (a gold answer or an alias of one): the planner learns to pass it on."""
    out, delegations, searches = [], [], []
    for sub in q.plan.tasks:
        search = q.search(sub.task)
        shown = f" {normalize_answer(w.style.observation(w.tok, 'documents', search.text)[1])} "
        answer = next((a for a in sub.answers if normalize_answer(a) and f" {normalize_answer(a)} " in shown), None)
        if answer is None:
            continue
        demo = executor_demonstration(w.tok, sub.task, search, answer, w.style)
        out.append(q.record("executor", demo, answer, [search]))
        delegations.append((sub.task, answer))
        searches.append(search)
    if len(delegations) < len(q.plan.tasks):
        return out
    last = delegations[-1][1]
    golds = q.golds
    final = last if q.plan.kind == "bridge" and normalize_answer(last) in map(normalize_answer, golds) else golds[0]
    planner = planner_demonstration(w.tok, q.text, delegations, final, w.style)
    return [*out, q.record("planner", planner, final, searches)]


def write_demonstrations(w: Writer, q: Question) -> Written:
    """A row's demonstrations: one sub-question per hop where its plan knows them, else the question delegated
    whole (executor and planner), when its documents back the answer."""
    if q.plan is not None and q.plan.tasks:
        # A question the data splits is never taught as a restated task: without every hop, no planner
        # demonstration (the executors whose hop did find its result still teach searching for it).
        demos = _delegations(w, q)
        return Written(demos, ("planned", "kept" if any(d["role"] == "planner" for d in demos) else "dropped"))
    search = w.question_search(q)
    if search is None:
        return Written([], ("unsupported",))
    gold = q.golds[0]
    executor = executor_demonstration(w.tok, search.query, search, gold, w.style)
    planner = planner_demonstration(w.tok, q.text, [(search.query, gold)], gold, w.style)
    records = [q.record("executor", executor, gold, [search]), q.record("planner", planner, gold, [search])]
    return Written(records, ("restating",))


def _hop_queries(plan: HopPlan) -> list[str]:
    return [t.task for t in plan.tasks]


DEMONSTRATIONS = DemoFormat(
    "coda",
    write_demonstrations,
    prompts=lambda: planner_messages("{question}") + executor_messages("{task}"),
    thoughts=THOUGHTS,
    hop_queries=_hop_queries,
)

_CODA = dict(
    run=run_coda,
    reward="recipes.coda:reward",
    needs=frozenset({"retriever"}),
    roles=("planner", "executor"),
    metric="f1",
    params=CoDAParams,
    demonstrations=DEMONSTRATIONS,
)
AGENTS = (
    Agent("coda", **_CODA, description="a planner delegates sub-questions to executors that search"),
    Agent("red-coda", **_CODA, description="CoDA with RED-weighted SFT co-training (the trainer's side)"),
)
