"""CoDA: a Planner delegates sub-questions to ephemeral Executors; one model plays both roles, both are trained
(``red-coda`` is the same agent: RED changes only the trainer's SFT weighting).

- Planner: writes ``<think>``, ``<task>`` (delegate) or ``<answer>``; receives ``<result>``. A ``<task>`` block
  holds one sub-question per line (``agents.prompts.TASK_LINE_SEPARATOR``): the lines of one block are
  independent sub-questions, run in parallel, one ``<result>`` block each, in order. A turn ends at its first
  ``</task>``, so a turn delegates one block.
- Executor: a fresh context per task (its system prompt + the task, nothing of the planner's history);
  writes ``<think>``, ``<search>``, ``<refine>``, ``<answer>``; receives ``<documents>``.
- Only the executor's ``<answer>`` text returns to the planner, as ``<result>``; an executor that runs out
  of turns without answering returns an empty result (as upstream CoDA does).
- Each executor is its own sample, ``parent_id`` = its planner's sample id.
- All tasks of one planner turn run concurrently.
- A planner's episode runs as many executors as it needs and no more: a task that repeats an earlier task of the
  episode (the same normalised text) gets that task's answer again, and a task that restates the whole question
  (``agents.rewards.peco.restates``) once an executor has answered gets the latest answer, each without a new
  executor (a warm-started planner with turns to spare delegated its last task again and again). The reward
  still counts such tasks against the planner (``repeated``, ``restated``).

Reward (``reward_mode``): ``per_role`` (the default, ``agents.rewards.peco``) judges each role by what it
controls, reading the question's hop plan (``agents.plans.plan_for_record``; none held out): each executor by
the F1 of its answer against the expected answer of the plan's sub-question its task matches (the golds when
none does or there is no plan), plus format and a refine term against that same target; the planner by
``(6·F1 − 3)`` of its final answer, plus the fraction of the plan's facts its executors returned, minus the
fraction of its tasks that restate the question or repeat an earlier task, plus format. Format pays only for tags with content. The
episode's reward and components (what eval and RED's accuracy read) are the planner's; each executor's own
reward goes to its sample (``RewardResult.per_trajectory``), so the trainer should give executors their own
baseline (``[trainer] role_baseline = "per_role"``: with ``inherit`` they copy the planner's advantage and
their rewards are only logged). ``shared`` is upstream CoDA's, the ablation arm: ``(6·F1 − 3)`` of the
planner's answer plus format and refine terms (``agents.rewards.formulas.coda_reward``), one value for the
planner and every executor it spawned. The knobs: ``CoDAParams``.

Demonstrations (make-sft's ``coda`` format): per question, the executor's (``<search>`` → ``<documents>`` (mask
0) → ``<refine>`` quoting the retrieved sentence that holds the answer → ``<answer>``) and the planner's
(``<task>`` → ``<result>`` with the executor's answer (mask 0) → ``<answer>``), so co-training teaches the
format the CoDA loop runs (upstream CoDA's SFT data never used ``<task>``; ``docs/upstream.md``). With a hop plan
that knows what each hop asks (2Wiki's evidence triples, ``--hops supporting``) the planner delegates one
sub-question per hop, the plan's turns (``HopPlan.turns``: a bridge's hops one per turn, a comparison's two facts in
one turn, a bridge_comparison's four as two turns of two), each to its own executor whose documents hold that hop's
expected result; the final answer of a bridge is its last executor's answer, word for word. A question the data
splits is never taught as a restated task, nor is a 2Wiki question whose row has no triples to split it with.
HotpotQA rows have no triples: a bridge question is split where ``agents.hotpot_plans`` finds the phrase naming its
bridge entity (28 of the 198 bridge questions of the bundled train split); otherwise the question is delegated whole.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import Field

from agents.answers import normalize_answer
from agents.base import Agent, AgentParams, Scoring, episode_reward
from agents.coda_demos import THOUGHTS, executor_demonstration, planner_demonstration
from agents.core.demonstrations import DemoFormat, Question, Writer, Written
from agents.core.episode import AgentContext, Episode, RewardResult, SearchTrace, TokenTrajectory, search_documents
from agents.core.turns import Action, AgentRole, Observation, RoleSpec, run_turns
from agents.datasets import PromptRecord
from agents.plans import HopPlan, plan_for_record, question_type
from agents.prompts import (
    INVALID_PLANNER_ACTION,
    INVALID_SEARCH_ACTION,
    OBSERVATION_WRAP,
    TASK_LINE_SEPARATOR,
    executor_messages,
    planner_messages,
)
from agents.rewards.formulas import ExecutorRun, coda_reward
from agents.rewards.peco import RESTATES, ExecutorTurns, peco_reward, restates

# The roles it trains, one model playing both. A planner's <task> block may hold several sub-questions (one per
# line): one <result> each. The executor prompt asks for a <refine> summary after every search; a further <think>
# is optional.
PLANNER = AgentRole(
    "planner",
    tags=("think", "task", "answer"),
    actions=("task", "answer"),
    grammar=r"think (?:task (?:result )+think )*answer ",
)
EXECUTOR = AgentRole(
    "executor",
    tags=("think", "search", "refine", "answer"),
    actions=("search", "answer"),
    grammar=r"think (?:search documents refine (?:think )?)*answer ",
)


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
    """The planner's delegations: each task and the answer it got back ('' for none), in order; ``executed``: whether
    the task ran its own executor (the episode's children, in order, are those that did), () = every one did. A
    task that did not got an earlier executor's answer (``run_coda``)."""

    tasks: tuple[str, ...] = ()
    executor_answers: tuple[str, ...] = ()
    executed: tuple[bool, ...] = ()

    def executed_tasks(self) -> list[tuple[str, str]]:
        """``(task, answer)`` of each task that ran its own executor, in spawn order."""
        ran = self.executed or (True,) * len(self.tasks)
        return [(t, a) for t, a, r in zip(self.tasks, self.executor_answers, ran, strict=True) if r]


def split_tasks(content: str) -> list[str]:
    """The sub-questions of one ``<task>`` block: one per line, blank lines left out (a block with none is one
    empty task, as before the lines were split)."""
    return [line.strip() for line in content.split(TASK_LINE_SEPARATOR) if line.strip()] or [content.strip()]


def known_answer(task: str, question: str, asked: dict[str, str], latest: str) -> str | None:
    """What the episode already knows for ``task``: the answer of an earlier task with the same normalised text,
    else, for a task that restates the whole ``question``, the ``latest`` executor answer ('': none yet); None
    when the task needs an executor of its own."""
    key = normalize_answer(task)
    if key in asked:
        return asked[key]
    if latest and restates(task, question):
        return latest
    return None


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
        actions=EXECUTOR.actions,
        invalid_message=INVALID_SEARCH_ACTION,
        budget=ctx.budget(EXECUTOR.name),
        forced_final=True,
        env_frame=ctx.env_frame,
    )
    outcome = await run_turns(traj, ctx.policy, ctx.tok, spec, act)
    return ExecutorResult(traj, outcome.answer or "", queries, retrieved)


async def run_coda(ctx: AgentContext, record: PromptRecord) -> Episode:
    planner = TokenTrajectory(ctx.tok.render(planner_messages(record.question)), role="planner")
    episode = Episode(main=planner)
    tasks: list[str] = []
    answers: list[str] = []
    executed: list[bool] = []
    executors: list[ExecutorResult] = []
    asked: dict[str, str] = {}  # normalised task -> the answer it got

    async def act(actions: list[Action]) -> Observation:
        turn = [t for a in actions for t in split_tasks(a.content)]
        # What the earlier turns know is settled before this turn runs; a task asked twice in one turn runs once.
        latest = next((a for a in reversed(answers) if a.strip()), "")
        known = [known_answer(t, record.question, asked, latest) for t in turn]
        keys = [normalize_answer(t) for t in turn]
        new = [i for i, k in enumerate(known) if k is None and keys[i] not in keys[:i]]
        runs = await asyncio.gather(*(run_executor(ctx, turn[i], planner.sample_id) for i in new))
        executors.extend(runs)
        episode.children.extend(r.traj for r in runs)
        ran = {keys[i]: r.answer for i, r in zip(new, runs, strict=True)}
        for i, task in enumerate(turn):
            tasks.append(task)
            answers.append(known[i] if known[i] is not None else ran[keys[i]])
            executed.append(i in new)
            asked.setdefault(keys[i], answers[-1])
        results = [a.strip() for a in answers[len(answers) - len(turn) :]]
        # Several tasks in one turn: one <result> block each, in task order (planner_demonstration writes the same).
        before, after = OBSERVATION_WRAP["result"]
        return Observation(content=(after + before).join(results), before=before, after=after, tag="result")

    spec = RoleSpec(
        actions=PLANNER.actions,
        invalid_message=INVALID_PLANNER_ACTION,
        budget=ctx.budget(PLANNER.name),
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
    episode.facts = CodaFacts(tuple(tasks), tuple(answers), tuple(executed))
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
    # Facts are written by run_coda, every task with the answer it got and whether it ran an executor; an episode
    # assembled elsewhere (a test, a replay) may have none: its executors then have no task and no answer to score.
    if facts is None:
        facts = CodaFacts(("",) * n, ("",) * n)
    tasks, answers = facts.tasks, facts.executor_answers
    if len(tasks) != len(answers) or len(facts.executed) not in (0, len(tasks)):
        raise ValueError(f"CoDA facts hold {len(tasks)} tasks, {len(answers)} answers, {len(facts.executed)} flags")
    spawned = facts.executed_tasks()
    if len(spawned) != n:
        m = len(spawned)  # the tasks that ran an executor of their own
        raise ValueError(f"CoDA facts hold {m} tasks and {m} answers for {n} executors")
    executors = [
        ExecutorTurns(c.sample_id, task, answer, c.generated_text, c.observations("documents"))
        for c, (task, answer) in zip(episode.children, spawned, strict=True)
    ]
    return peco_reward(
        episode.answer,
        episode.main.generated_text,
        executors,
        record.question,
        record.golden_answers,
        plan.tasks if plan is not None else (),
        tasks=tasks,
        executor_answers=answers,
        metric=scoring.metric,
        format_weight=params.format_weight,
        refine_weight=params.refine_weight,
        fact_weight=params.fact_weight,
        restate_penalty=params.restate_penalty,
    )


# ---------------------------------------------------------------- demonstrations
# A kinship question's planner demonstration is written this many times (``copy`` 1, 2, ...: each a group of
# its own in the SFT stream): the split goes through a relation's path (a paternal grandfather is the father's
# father) that only these rows teach (about one 2Wiki split planner row in eight), and a 600 s warm start shows
# about 150 planner demonstrations in all. Taught once, 45% of held-out kinship tasks restated the question
# (compositional: 11%).
KINSHIP_REPEATS = 3


def _delegations(w: Writer, q: Question) -> list[dict]:
    """An executor per sub-question whose documents hold its expected result (that result is its answer), then,
    when every sub-question's did, the planner that delegated them turn by turn as the plan groups them
    (``HopPlan.turns``) and answers. A bridge's final answer is its last executor's answer, word for word (hop 2
    expects the golds, so it is a gold answer or an alias of one): the planner learns to pass on its last result,
    never to answer with a task's text. A comparison's is the gold: it names the entity its facts point to."""
    out, turns, searches = [], [], []
    for group in q.plan.turns:
        turn = []
        for sub in group:
            search = q.search(sub.task)
            shown = f" {normalize_answer(w.style.observation(w.tok, 'documents', search.text)[1])} "
            answer = next((a for a in sub.answers if normalize_answer(a) and f" {normalize_answer(a)} " in shown), None)
            if answer is None:
                continue
            demo = executor_demonstration(w.tok, sub.task, search, answer, w.style)
            out.append(q.record("executor", demo, answer, [search]))
            turn.append((sub.task, answer))
            searches.append(search)
        turns.append(turn)
    if sum(map(len, turns)) < len(q.plan.tasks):
        return out
    final = turns[-1][-1][1] if q.plan.kind == "bridge" else q.golds[0]
    planner = planner_demonstration(w.tok, q.text, turns, final, w.style)
    return [*out, q.record("planner", planner, final, searches)]


def _unsplit_2wiki(q: Question) -> bool:
    """A 2Wiki question whose row has no triples to split it with (217 of the 999 training rows are comparisons
    or bridge_comparisons, 11 bridges): 2Wiki splits its other questions, so delegating this one whole would
    teach a restating task where the planner should split. HotpotQA's rows have no triples: a question
    ``agents.hotpot_plans`` cannot split, delegated whole, is all its planner can be shown."""
    meta = q.row.get("metadata") or {}
    return q.plan is not None and not q.plan.tasks and meta.get("dataset") == "2wikimultihopqa"


def write_demonstrations(w: Writer, q: Question) -> Written:
    """A row's demonstrations: one sub-question per hop where its plan knows them, else the question delegated
    whole (executor and planner), when its documents back the answer."""
    if q.plan is not None and q.plan.tasks:
        # A question the data splits is never taught as a restated task: without every hop, no planner
        # demonstration (the executors whose hop did find its result still teach searching for it).
        demos = _delegations(w, q)
        planners = [d for d in demos if d["role"] == "planner"]
        if question_type(q.row) == "inference":
            demos += [{**d, "copy": k} for k in range(1, KINSHIP_REPEATS) for d in planners]
        return Written(demos, ("planned", "kept" if planners else "dropped"))
    search = w.question_search(q)
    if search is None:
        return Written([], ("unsupported",))
    gold = q.golds[0]
    executor = q.record("executor", executor_demonstration(w.tok, search.query, search, gold, w.style), gold, [search])
    if _unsplit_2wiki(q):
        # No restating planner; the executor still teaches searching and answering from the documents.
        return Written([executor], ("dropped",))
    planner = planner_demonstration(w.tok, q.text, [[(search.query, gold)]], gold, w.style)
    return Written([executor, q.record("planner", planner, gold, [search])], ("restating",))


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
    reward="agents.coda:reward",
    needs=frozenset({"retriever"}),
    roles=(PLANNER, EXECUTOR),
    metric="f1",
    params=CoDAParams,
    demonstrations=DEMONSTRATIONS,
)
AGENTS = (
    Agent("coda", **_CODA, description="a planner delegates sub-questions to executors that search"),
    Agent("red-coda", **_CODA, description="CoDA with RED-weighted SFT co-training (the trainer's side)"),
)
