"""One episode: what every agent needs (``AgentContext``), the token buffer each role builds
(``TokenTrajectory``) and what every agent returns (``Episode``).

The context holds the tokenizer, the policy and frozen generators, the retriever and searcher clients and
the per-role turn budgets. It has no mutable per-episode state, so one context serves any number of
concurrent episodes.

``TokenTrajectory`` is the token buffer of one role's episode, built strictly by appending. Token-in/token-out: the prompt is encoded once; each turn sends exactly the ids gathered so far, and the
generated ids (as sampled) and observation ids (as encoded) are appended. ``next_prompt`` asserts that the
new prompt is the previous prompt plus the previous turn's generated ids plus what was appended after them,
so a future change that re-renders history fails loudly instead of training on ids the sampler never saw.

Per token it records the loss mask (1 only where the trained policy sampled the token), the sampler's
logprob and the policy version (``-1``/``0.0`` everywhere else).

Its text is kept as segments that say who wrote them: the model's turns, the environment's observations
(with their wrapper tag) and the environment's messages (invalid action, final-answer nudge). Rewards and
metrics read the model's own turns (``generated_text``, ``action_text``) and the observations by tag, never
``response_text``: the environment's messages spell out ``<answer> and </answer>``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agents.core.llm import Generation, Generator
from agents.core.turns import Budget
from agents.prompts import INLINE, TokenizerLike, format_documents
from shared.protocol import Role, Sample
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


# The token buffer of one role


@dataclass(frozen=True)
class Segment:
    """One stretch of the response: a generated turn, an observation (``tag`` = its wrapper) or a message."""

    text: str  # exactly what the ids of this stretch decode to (observations: wrapper included)
    source: str  # "generated" | "observation" | "message"
    tag: str | None = None  # observations: the wrapper tag ("information", "documents", "result", ...)
    content: str = ""  # observations: the text inside the wrapper (after truncation)


class TokenTrajectory:
    def __init__(
        self,
        prompt_ids: list[int],
        *,
        role: Role,
        trained: bool = True,
        parent_id: str | None = None,
        sample_id: str | None = None,
    ) -> None:
        self.sample_id = sample_id or uuid.uuid4().hex[:16]
        self.role, self.trained, self.parent_id = role, trained, parent_id
        self.prompt_len = len(prompt_ids)
        self.ids: list[int] = list(prompt_ids)
        self.mask: list[int] = [0] * len(prompt_ids)
        self.logprobs: list[float] = [0.0] * len(prompt_ids)
        self.versions: list[int] = [-1] * len(prompt_ids)
        self.segments: list[Segment] = []  # response text: generated and inserted, in order
        self.num_turns = 0
        self.finish_reason = "stop"
        self._last_prompt: list[int] | None = None
        self._last_generated: list[int] = []

    # ------------------------------------------------------------ building
    def next_prompt(self) -> list[int]:
        """The ids to send for the next turn (checked to extend the previous prompt + its generation)."""
        if self._last_prompt is not None:
            n, g = len(self._last_prompt), len(self._last_generated)
            if self.ids[:n] != self._last_prompt or self.ids[n : n + g] != self._last_generated:
                raise AssertionError(
                    "token-in/token-out violated: the next prompt does not extend the previous "
                    "prompt and its generated ids"
                )
        self._last_prompt = list(self.ids)
        return list(self.ids)

    def add_generation(self, gen: Generation) -> None:
        if len(gen.token_ids) != len(gen.logprobs):
            raise ValueError(f"{len(gen.logprobs)} logprobs for {len(gen.token_ids)} tokens")
        m = 1 if self.trained else 0
        self.ids += gen.token_ids
        self.mask += [m] * len(gen.token_ids)
        self.logprobs += list(gen.logprobs) if m else [0.0] * len(gen.token_ids)
        self.versions += [gen.version] * len(gen.token_ids) if m else [-1] * len(gen.token_ids)
        self.segments.append(Segment(gen.text, "generated"))
        self._last_generated = list(gen.token_ids)
        self.num_turns += 1

    def add_observation(self, ids: list[int], text: str, *, tag: str | None = None, content: str | None = None) -> None:
        """Environment text: attended to, never trained on. With ``tag``, an observation wrapped in that tag
        (documents, results, ...) whose inner text is ``content``; without, a message (invalid action, nudge)."""
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)
        if tag is None:
            self.segments.append(Segment(text, "message"))
        else:
            self.segments.append(Segment(text, "observation", tag, text if content is None else content))

    # ------------------------------------------------------------ reading
    @property
    def pieces(self) -> list[str]:
        return [s.text for s in self.segments]

    @property
    def response_text(self) -> str:
        """Everything after the prompt, environment text included: for display, never for scoring."""
        return "".join(s.text for s in self.segments)

    @property
    def turns(self) -> list[str]:
        """The text of each generated turn, in order."""
        return [s.text for s in self.segments if s.source == "generated"]

    @property
    def generated_text(self) -> str:
        """The model's own turns, concatenated: what format and refine scores read."""
        return "".join(self.turns)

    @property
    def action_text(self) -> str:
        """The model's turns with each observation reduced to its empty wrapper block and messages left out:
        the tag sequence the strict validator checks (call → observation → ...), with nothing the
        environment wrote in it."""
        return "".join(
            s.text if s.source == "generated" else f"<{s.tag}></{s.tag}>"
            for s in self.segments
            if s.source != "message"
        )

    def observations(self, tag: str) -> list[str]:
        """The contents of the observations wrapped in ``tag``, in order (e.g. the retrieved documents)."""
        return [s.content for s in self.segments if s.source == "observation" and s.tag == tag]

    @property
    def generated_tokens(self) -> int:
        return sum(1 for v in self.versions[self.prompt_len :] if v != -1) if self.trained else 0

    def to_sample(
        self, reward: float = 0.0, components: dict[str, float] | None = None, text: str | None = None
    ) -> Sample:
        return Sample(
            sample_id=self.sample_id,
            role=self.role,
            parent_id=self.parent_id,
            token_ids=self.ids,
            prompt_len=self.prompt_len,
            loss_mask=self.mask,
            logprobs=self.logprobs,
            versions=self.versions,
            reward=reward,
            reward_components=components or {},
            num_turns=self.num_turns,
            finish_reason=self.finish_reason,
            text=text,
        )
