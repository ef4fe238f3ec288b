"""The flat Search-R1 agent: ``think → (search → information → think)* → answer`` with one trained policy.

Also the Thinker of ``thinker-searcher``: the same loop, but a ``<search>`` goes to the frozen searcher
service and its summary comes back inside ``<information>``; only the Thinker's own tokens are trained.
"""

from __future__ import annotations

from shared.agents.context import AgentContext, Episode, search_documents
from shared.agents.trajectory import TokenTrajectory
from shared.agents.turns import Action, Observation, RoleSpec, run_turns
from shared.datasets import PromptRecord
from shared.prompts import INVALID_SEARCH_ACTION, NO_RESULTS, search_agent_messages


def flat_spec(ctx: AgentContext, role: str) -> RoleSpec:
    return RoleSpec(actions=("search", "answer"), invalid_message=INVALID_SEARCH_ACTION, budget=ctx.budget(role))


async def run_search_r1(ctx: AgentContext, record: PromptRecord) -> Episode:
    traj = TokenTrajectory(ctx.tok.render(search_agent_messages(record.question)), role="policy")
    retrieved: list[list[str]] = []
    queries: list[str] = []

    async def act(actions: list[Action]) -> Observation:
        queries.append(actions[0].content)
        blocks, ids = await search_documents(ctx, [actions[0].content])  # the seed executes the first query
        retrieved.extend(ids)
        return Observation.wrapped("information", blocks[0])

    outcome = await run_turns(traj, ctx.policy, ctx.tok, flat_spec(ctx, "policy"), act)
    return Episode(main=traj, answer=outcome.answer,
                   info={"num_searches": len(retrieved), "retrieved_ids": retrieved, "queries": queries,
                         "invalid_turns": outcome.invalid_turns})


async def run_thinker(ctx: AgentContext, record: PromptRecord) -> Episode:
    if ctx.searcher is None:
        raise RuntimeError("thinker-searcher needs a searcher client")
    traj = TokenTrajectory(ctx.tok.render(search_agent_messages(record.question)), role="thinker")
    searches: list[dict] = []

    async def act(actions: list[Action]) -> Observation:
        query = actions[0].content
        if not query:
            return Observation.wrapped("information", NO_RESULTS)
        found = await ctx.searcher.search(query, max_turns=ctx.searcher_max_turns)
        searches.append({"query": query, "num_searches": found.num_searches, "success": found.success})
        return Observation.wrapped("information", found.summary)

    outcome = await run_turns(traj, ctx.policy, ctx.tok, flat_spec(ctx, "thinker"), act)
    return Episode(main=traj, answer=outcome.answer,
                   info={"num_searches": len(searches),
                         "searcher_retrievals": sum(s["num_searches"] for s in searches),
                         "invalid_turns": outcome.invalid_turns})
