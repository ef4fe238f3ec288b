"""CoDA: a Planner delegates sub-questions to ephemeral Executors; one shared model plays both roles.

- Planner: writes ``<think>``, ``<task>`` (delegate) or ``<answer>``; receives ``<result>``.
- Executor: a fresh context per task (its system prompt + the task, nothing of the planner's history);
  writes ``<think>``, ``<search>``, ``<refine>``, ``<answer>``; receives ``<documents>``.
- Only the executor's ``<answer>`` text returns to the planner, as ``<result>``; an executor that runs out
  of turns without answering returns an empty result (as in the seed).
- Both roles are trained: each executor is its own sample, ``parent_id`` = its planner's sample id.
- All tasks of one planner turn run concurrently.
"""

from __future__ import annotations

import asyncio

from shared.agents.context import AgentContext, Episode, search_documents
from shared.agents.trajectory import TokenTrajectory
from shared.agents.turns import Action, Observation, RoleSpec, run_turns
from shared.datasets import PromptRecord
from shared.prompts import INVALID_PLANNER_ACTION, INVALID_SEARCH_ACTION, executor_messages, planner_messages


async def run_executor(ctx: AgentContext, task: str, parent_id: str) -> tuple[TokenTrajectory, str, list]:
    """One executor sub-episode: returns its trajectory, its answer text ('' if none) and retrieved ids."""
    traj = TokenTrajectory(ctx.tok.render(executor_messages(task)), role="executor", parent_id=parent_id)
    retrieved: list[list[str]] = []

    async def act(actions: list[Action]) -> Observation:
        blocks, ids = await search_documents(ctx, [actions[0].content])
        retrieved.extend(ids)
        return Observation.wrapped("documents", blocks[0])

    spec = RoleSpec(actions=("search", "answer"), invalid_message=INVALID_SEARCH_ACTION,
                    budget=ctx.budget("executor"), forced_final=True)
    outcome = await run_turns(traj, ctx.policy, ctx.tok, spec, act)
    return traj, outcome.answer or "", retrieved


async def run_coda(ctx: AgentContext, record: PromptRecord) -> Episode:
    planner = TokenTrajectory(ctx.tok.render(planner_messages(record.question)), role="planner")
    episode = Episode(main=planner, info={"tasks": [], "executor_answers": [], "retrieved_ids": []})

    async def act(actions: list[Action]) -> Observation:
        tasks = [a.content for a in actions]
        runs = await asyncio.gather(*(run_executor(ctx, t, planner.sample_id) for t in tasks))
        results = []
        for task, (traj, answer, retrieved) in zip(tasks, runs, strict=True):
            episode.children.append(traj)
            episode.info["tasks"].append(task)
            episode.info["executor_answers"].append(answer)
            episode.info["retrieved_ids"].extend(retrieved)
            results.append(answer.strip())
        # Several tasks in one turn: one <result> block each, in task order.
        before, after = Observation.wrapped("result", "").before, Observation.wrapped("result", "").after
        return Observation(content=(after + before).join(results), before=before, after=after, tag="result")

    spec = RoleSpec(actions=("task", "answer"), invalid_message=INVALID_PLANNER_ACTION,
                    budget=ctx.budget("planner"), forced_final=True)
    outcome = await run_turns(planner, ctx.policy, ctx.tok, spec, act)
    episode.answer = outcome.answer
    episode.info["num_searches"] = len(episode.info["retrieved_ids"])
    episode.info["invalid_turns"] = outcome.invalid_turns
    return episode
