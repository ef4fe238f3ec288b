"""CoDA: a Planner delegates sub-questions to ephemeral Executors; one model plays both roles, both are trained
(``red-coda`` is the same agent: RED changes only the trainer's SFT weighting).

- Planner: writes ``<think>``, ``<task>`` (delegate) or ``<answer>``; receives ``<result>``.
- Executor: a fresh context per task (its system prompt + the task, nothing of the planner's history);
  writes ``<think>``, ``<search>``, ``<refine>``, ``<answer>``; receives ``<documents>``.
- Only the executor's ``<answer>`` text returns to the planner, as ``<result>``; an executor that runs out
  of turns without answering returns an empty result (as upstream CoDA does).
- Each executor is its own sample, ``parent_id`` = its planner's sample id.
- All tasks of one planner turn run concurrently.

Reward: ``(6·F1 − 3)`` of the planner's answer plus format and refine terms (``recipes.rewards.formulas``); the
same value goes to the planner and every executor it spawned. Its knobs: ``CoDAParams``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pydantic import Field

from recipes.base import Agent, AgentParams, Scoring, episode_reward
from recipes.core.context import AgentContext, Episode, SearchTrace, search_documents
from recipes.core.trajectory import TokenTrajectory
from recipes.core.turns import Action, Observation, RoleSpec, run_turns
from recipes.datasets import PromptRecord
from recipes.prompts import INVALID_PLANNER_ACTION, INVALID_SEARCH_ACTION, executor_messages, planner_messages
from recipes.rewards.formulas import ExecutorRun, coda_reward
from recipes.rewards.result import RewardResult


class CoDAParams(AgentParams):
    """CoDA's own knobs, [rollout] keys (coda and red-coda read them)."""

    executor_max_turns: int = Field(3, ge=1, description="Action turns of each CoDA executor")
    format_weight: float = Field(0.1, description="CoDA format-term weight")
    refine_weight: float = Field(0.1, description="CoDA refine-term weight")


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


_CODA = dict(
    run=run_coda,
    reward="recipes.coda:reward",
    needs=frozenset({"retriever"}),
    roles=("planner", "executor"),
    metric="f1",
    demonstrations="coda",
)
AGENTS = (
    Agent("coda", **_CODA, description="a planner delegates sub-questions to executors that search"),
    Agent("red-coda", **_CODA, description="CoDA with RED-weighted SFT co-training (the trainer's side)"),
)
