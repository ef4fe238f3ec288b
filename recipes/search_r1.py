"""The flat Search-R1 agent, ``think → (search → information → think)* → answer`` with one trained policy, and
its Thinker variant (``thinker-searcher``): the same loop, but a ``<search>`` goes to the frozen searcher service
and its summary comes back inside ``<information>``; only the Thinker's own tokens are trained.

Reward: the answer's score (EM by default), with Search-R1's structure-format shaping; it reads the parsed
answer, the policy's own action text and the ``<information>`` observations only. Knobs: ``SearchR1Params``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field

from recipes.base import Agent, AgentParams, Scoring, episode_reward
from recipes.core.context import AgentContext, Episode, SearchTrace, search_documents
from recipes.core.trajectory import TokenTrajectory
from recipes.core.turns import Action, Observation, RoleSpec, run_turns
from recipes.datasets import PromptRecord
from recipes.prompts import INVALID_SEARCH_ACTION, NO_RESULTS, search_agent_messages
from recipes.rewards.formulas import search_r1_reward
from recipes.rewards.result import RewardResult


class SearchR1Params(AgentParams):
    """The thinker-searcher's own knob, a [rollout.search_r1] key (search-r1 has none)."""

    table: ClassVar[str] = "search_r1"

    searcher_max_turns: int | None = Field(
        None,
        ge=1,
        description="thinker-searcher: searcher budget sent with each request (none: [searcher] max_turns)",
    )


def flat_spec(ctx: AgentContext, role: str) -> RoleSpec:
    return RoleSpec(
        actions=("search", "answer"),
        invalid_message=INVALID_SEARCH_ACTION,
        budget=ctx.budget(role),
        env_frame=ctx.env_frame,
    )


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
    return Episode(
        main=traj, answer=outcome.answer, search=SearchTrace.of(queries, retrieved), invalid_turns=outcome.invalid_turns
    )


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
    return Episode(
        main=traj,
        answer=outcome.answer,
        search=SearchTrace(tuple(c.query for c in calls)),
        facts=ThinkerFacts(tuple(calls)),
        invalid_turns=outcome.invalid_turns,
    )


@episode_reward
def reward(episode: Episode, scoring: Scoring) -> RewardResult:
    return search_r1_reward(
        episode.answer,
        scoring.record.golden_answers,
        action_text=episode.main.action_text,
        information=episode.main.observations("information"),
        metric=scoring.metric,
    )


AGENTS = (
    Agent(
        "search-r1",
        run_search_r1,
        reward="recipes.search_r1:reward",
        needs=frozenset({"retriever"}),
        roles=("policy",),
        demonstrations="search",
        description="one policy: think, search the retriever, answer (Search-R1)",
    ),
    Agent(
        "thinker-searcher",
        run_thinker,
        reward="recipes.search_r1:reward",
        needs=frozenset({"searcher"}),
        roles=("thinker",),
        params=SearchR1Params,
        demonstrations="search",
        description="a trained Thinker delegates searches to the frozen searcher service",
    ),
)
