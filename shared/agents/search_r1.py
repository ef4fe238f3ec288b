"""The flat Search-R1 agent: ``think → (search → information → think)* → answer`` with one trained policy.

Also the Thinker of ``thinker-searcher``: the same loop, but a ``<search>`` goes to the frozen searcher
service and its summary comes back inside ``<information>``; only the Thinker's own tokens are trained.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.agents.context import AgentContext, Episode, SearchTrace, search_documents
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
        blocks, ids = await search_documents(ctx, [actions[0].content])  # Search-R1 executes only the first query
        retrieved.extend(ids)
        return Observation.wrapped("information", blocks[0])

    outcome = await run_turns(traj, ctx.policy, ctx.tok, flat_spec(ctx, "policy"), act)
    return Episode(main=traj, answer=outcome.answer, search=SearchTrace.of(queries, retrieved),
                   invalid_turns=outcome.invalid_turns)


@dataclass(frozen=True)
class SearcherCall:
    """One delegation of a Thinker to the frozen searcher service."""

    query: str
    num_searches: int  # retriever calls the searcher made for it
    success: bool


@dataclass(frozen=True)
class ThinkerFacts:
    calls: tuple[SearcherCall, ...] = ()


async def run_thinker(ctx: AgentContext, record: PromptRecord) -> Episode:
    if ctx.searcher is None:
        raise RuntimeError("thinker-searcher needs a searcher client")
    traj = TokenTrajectory(ctx.tok.render(search_agent_messages(record.question)), role="thinker")
    calls: list[SearcherCall] = []

    async def act(actions: list[Action]) -> Observation:
        query = actions[0].content
        if not query:
            return Observation.wrapped("information", NO_RESULTS)
        found = await ctx.searcher.search(query, max_turns=ctx.searcher_max_turns)
        calls.append(SearcherCall(query, found.num_searches, found.success))
        return Observation.wrapped("information", found.summary)

    outcome = await run_turns(traj, ctx.policy, ctx.tok, flat_spec(ctx, "thinker"), act)
    # The queries went to the searcher, not the retriever: no retrieved ids of the Thinker's own.
    return Episode(main=traj, answer=outcome.answer, search=SearchTrace(tuple(c.query for c in calls)),
                   facts=ThinkerFacts(tuple(calls)), invalid_turns=outcome.invalid_turns)
