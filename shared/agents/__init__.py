"""Episode drivers for every recipe, shared by the rollout service (training, eval) and the searcher service.

``run_episode(recipe, ctx, record)`` runs one episode and returns an ``Episode``: token trajectories (with
per-token loss mask, sampler logprob and policy version), the answer, and the facts the recipe's reward
needs. The common turn engine is ``shared.agents.turns``; prompts are in ``shared.prompts``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from shared.agents.coda import run_coda
from shared.agents.context import AgentContext, Episode
from shared.agents.recursive_reasoner import run_recursive_reasoner
from shared.agents.search_r1 import run_search_r1, run_thinker
from shared.agents.tool_agent import run_tool_agent
from shared.agents.turns import Budget
from shared.datasets import PromptRecord

AgentFn = Callable[[AgentContext, PromptRecord], Awaitable[Episode]]

AGENTS: dict[str, AgentFn] = {
    "search-r1": run_search_r1,
    "coda": run_coda,
    "red-coda": run_coda,  # same agent; RED changes only the trainer
    "thinker-searcher": run_thinker,
    "recursive-reasoner": run_recursive_reasoner,
    "tool-agent": run_tool_agent,
}


async def run_episode(recipe: str, ctx: AgentContext, record: PromptRecord) -> Episode:
    try:
        agent = AGENTS[recipe]
    except KeyError:
        raise ValueError(f"unknown recipe {recipe!r}; known: {sorted(AGENTS)}") from None
    return await agent(ctx, record)


__all__ = ["AGENTS", "AgentContext", "Budget", "Episode", "run_episode"]
