"""What every agent needs (``AgentContext``) and what every agent returns (``Episode``).

The context holds the tokenizer, the policy and frozen generators, the retriever and searcher clients and
the per-role turn budgets. It has no mutable per-episode state, so one context serves any number of
concurrent episodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agents.core.llm import Generator
from agents.core.tokenizer import INLINE, TokenizerLike
from agents.core.trajectory import TokenTrajectory
from agents.core.turns import Budget
from agents.prompts import format_documents
from shared.protocol.retrieval import RetrievedDocument
from shared.protocol.search import SearchResponse


class Retriever(Protocol):
    async def retrieve(self, queries: list[str], topk: int | None = None) -> list[list[RetrievedDocument]]: ...


class Searcher(Protocol):
    async def search(self, query: str, max_turns: int | None = None) -> SearchResponse: ...


@dataclass
class AgentContext:
    tok: TokenizerLike
    policy: Generator
    retriever: Retriever | None = None
    frozen: Generator | None = None  # searcher model / recursive-reasoner worker
    searcher: Searcher | None = None
    budgets: dict[str, Budget] = field(default_factory=dict)  # per role; missing roles get Budget()
    topk: int = 3
    searcher_max_turns: int | None = None
    stop: tuple[str, ...] = ()  # extra stop strings (single-turn)
    env_frame: tuple[str, str] = INLINE  # around environment text (``[rollout] env_turn``)

    def budget(self, role: str) -> Budget:
        return self.budgets.get(role, Budget())


@dataclass(frozen=True)
class SearchTrace:
    """What a searching agent searched, in order: each query and the document ids its search returned (every
    searching agent writes one, so search metrics read the same facts whatever the agent)."""

    queries: tuple[str, ...] = ()
    retrieved_ids: tuple[tuple[str, ...], ...] = ()

    @classmethod
    def of(cls, queries: list[str], retrieved: list[list[str]]) -> SearchTrace:
        return cls(tuple(queries), tuple(tuple(str(i) for i in ids) for ids in retrieved))

    @property
    def num_searches(self) -> int:
        return len(self.queries)


@dataclass
class Episode:
    """One agent run: the main trajectory, its sub-trajectories (executors), the answer and the facts its
    reward reads: ``search`` for searching agents, ``facts`` (a frozen dataclass of the agent's own kind)."""

    main: TokenTrajectory
    children: list[TokenTrajectory] = field(default_factory=list)
    answer: str | None = None
    search: SearchTrace = SearchTrace()
    facts: Any = None
    invalid_turns: int = 0

    @property
    def trajectories(self) -> list[TokenTrajectory]:
        return [self.main, *self.children]

    @property
    def num_turns(self) -> int:
        return sum(t.num_turns for t in self.trajectories)

    @property
    def generated_tokens(self) -> int:
        return sum(t.generated_tokens for t in self.trajectories)


async def search_documents(ctx: AgentContext, queries: list[str]) -> tuple[list[str], list[list[str]]]:
    """Formatted document blocks for ``queries`` (one batched retriever call) and the retrieved ids."""
    if ctx.retriever is None:
        raise RuntimeError("this agent searches but no retriever is configured")
    results = await ctx.retriever.retrieve(queries, topk=ctx.topk)
    blocks = [format_documents([(d.title, d.text) for d in docs]) for docs in results]
    return blocks, [[d.id for d in docs] for docs in results]


@dataclass(frozen=True)
class RewardResult:
    """``reward`` is what the policy is trained on; ``components`` are the named terms, for logs and plots.

    ``components`` maps onto ``shared.protocol.Sample.reward_components`` unchanged.

    ``per_trajectory`` (hierarchical agents): a trajectory's own reward, keyed by its ``TokenTrajectory.sample_id``
    (fixed when the trajectory is made, so the reward can name it). A trajectory not in it, and every trajectory
    when it is None, gets this result. ``reward``/``components`` stay the episode's: eval and RED read them.
    """

    reward: float
    components: dict[str, float] = field(default_factory=dict)
    per_trajectory: Mapping[str, RewardResult] | None = None

    def __float__(self) -> float:
        return float(self.reward)

    def for_trajectory(self, sample_id: str) -> RewardResult:
        """The reward of the trajectory ``sample_id``: its own if the reward gave one, the episode's otherwise."""
        own = self.per_trajectory.get(sample_id) if self.per_trajectory else None
        return own if own is not None else self
