"""The frozen searcher's loop (served by ``services/searcher``): a real multi-turn search with a fixed model.

``think → search → information → … → answer`` with stop strings ``</search>`` and ``</answer>`` only, so a
``</think>`` never ends a turn (upstream's Searcher cut there and therefore never searched; docs/upstream.md). ``max_turns`` is an
argument of each call: concurrent requests with different budgets never share mutable state.
"""

from __future__ import annotations

from dataclasses import replace

from agents.core.episode import AgentContext, TokenTrajectory, search_documents
from agents.core.turns import Action, Observation, RoleSpec, run_turns
from agents.prompts import INVALID_SEARCH_ACTION, SEARCHER_NO_ANSWER, searcher_messages
from shared.protocol.search import SearchResponse


async def run_searcher(ctx: AgentContext, query: str, max_turns: int) -> SearchResponse:
    llm = ctx.frozen or ctx.policy
    traj = TokenTrajectory(ctx.tok.render(searcher_messages(query, max_turns)), role="policy", trained=False)
    searches = 0

    async def act(actions: list[Action]) -> Observation:
        nonlocal searches
        searches += 1
        blocks, _ = await search_documents(ctx, [actions[0].content])
        return Observation.wrapped("information", blocks[0])

    spec = RoleSpec(
        actions=("search", "answer"),
        invalid_message=INVALID_SEARCH_ACTION,
        budget=replace(ctx.budget("searcher"), max_turns=max_turns),
    )
    outcome = await run_turns(traj, llm, ctx.tok, spec, act)
    answer = outcome.answer
    return SearchResponse(
        summary=answer if answer else SEARCHER_NO_ANSWER,
        trajectory=list(traj.pieces),
        num_searches=searches,
        success=bool(answer),
    )
