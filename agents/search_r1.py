"""The flat Search-R1 agent, ``think → (search → information → think)* → answer`` with one trained policy, and
its Thinker variant (``thinker-searcher``): the same loop, but a ``<search>`` goes to the frozen searcher service
and its summary comes back inside ``<information>``; only the Thinker's own tokens are trained.

Reward: the answer's score (EM by default), with Search-R1's structure-format shaping; it reads the parsed
answer, the policy's own action text and the ``<information>`` observations only. Knobs: ``SearchR1Params``.

Demonstrations (make-sft's ``search`` format, both agents): ``<search> q </search>`` → ``<information>`` (the real
retrieved documents, mask 0) per search, then ``<answer> gold </answer>``. One search of the question verbatim;
with a hop plan (``--hops supporting``) two searches (a bridge question: the question, then the bridge entity; a
comparison: each compared entity), kept only when each search brought back the paragraph it is for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field

from agents.answers import AnswerMetric, answer_reward, sub_exact_match
from agents.base import Agent, AgentParams, Scoring, episode_reward
from agents.core.demonstrations import Demo, DemoFormat, Question, Search, Style, Writer, Written, assemble, supported
from agents.core.episode import AgentContext, Episode, RewardResult, SearchTrace, TokenTrajectory, search_documents
from agents.core.turns import Action, AgentRole, Observation, RoleSpec, is_valid_sequence, run_turns
from agents.datasets import PromptRecord
from agents.prompts import INLINE, INVALID_SEARCH_ACTION, NO_RESULTS, search_agent_messages


class SearchR1Params(AgentParams):
    """The thinker-searcher's own knob, a [rollout.search_r1] key (search-r1 has none)."""

    table: ClassVar[str] = "search_r1"

    searcher_max_turns: int | None = Field(
        None,
        ge=1,
        description="thinker-searcher: searcher budget sent with each request (none: [searcher] max_turns)",
    )


# The roles it trains: a flat policy (search-r1) and a thinker whose searches the searcher service runs; both
# think → (search → information → think)* → answer.
POLICY = AgentRole(
    "policy",
    tags=("think", "search", "answer"),
    actions=("search", "answer"),
    grammar=r"think (?:search information think )*answer ",
)
THINKER = AgentRole("thinker", tags=POLICY.tags, actions=POLICY.actions, grammar=POLICY.grammar)


def flat_spec(ctx: AgentContext, role: str) -> RoleSpec:
    return RoleSpec(
        actions=POLICY.actions,
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


# ---------------------------------------------------------------- demonstrations
THOUGHTS = {
    "search": "I should look this up.",
    "search again": "I need one more fact.",
    "read": "The passages give the answer.",
}


def search_demonstration(tok, question: str, searches: Sequence[Search], gold: str, style: Style = Style()) -> Demo:
    """Each search and its ``<information>``, in order, then the answer."""
    pieces = [(tok.render(search_agent_messages(question)), 0)]
    for n, search in enumerate(searches):
        thought = style.thought(THOUGHTS["search" if n == 0 else "search again"])
        pieces.append((tok.encode(f"{thought}<search> {search.query} </search>"), 1))
        pieces.append((style.observation(tok, "information", search.text)[0], 0))
    pieces.append((tok.encode(f"{style.thought(THOUGHTS['read'])}<answer> {gold} </answer>"), 1))
    return assemble(tok, pieces)


def demonstration(
    tok, question: str, gold: str, docs_text: str, think: bool = True, frame: tuple[str, str] = INLINE
) -> Demo:
    """The one-search demonstration: the question searched verbatim, its documents, the answer."""
    return search_demonstration(tok, question, [Search(question.strip(), docs_text)], gold, Style(think, frame))


def _two_searches(w: Writer, q: Question) -> list[dict]:
    """The two-search demonstration of a planned row, or [] when its searches do not show what each hop needs."""
    searches = [q.search(query) for query in q.plan.queries]
    shown = [w.style.observation(w.tok, "information", s.text)[1] for s in searches]
    titles = [s.shown_titles(text) for s, text in zip(searches, shown, strict=True)]
    # Each search shows the paragraph it is for (a second search that found nothing new is no hop).
    if not all(set(want) <= set(got) for want, got in zip(q.plan.targets, titles, strict=True)):
        return []
    supporting = [t for want in q.plan.targets for t in want]
    if not supported("".join(shown), q.golds, [t for got in titles for t in got], supporting):
        return []
    demo = search_demonstration(w.tok, q.text, searches, q.golds[0], w.style)
    return [q.record("policy", demo, q.golds[0], searches)]


def write_demonstrations(w: Writer, q: Question) -> Written:
    """A row's demonstration: two searches where its plan allows one, else one search of the question."""
    demos = _two_searches(w, q) if q.plan is not None else []
    search = None if demos else w.question_search(q)
    if search is not None:
        demo = search_demonstration(w.tok, q.text, [search], q.golds[0], w.style)
        demos = [q.record("policy", demo, q.golds[0], [search])]
    return Written(demos, ("kept",) if demos else ("unsupported",))


DEMONSTRATIONS = DemoFormat(
    "search",
    write_demonstrations,
    prompts=lambda: search_agent_messages("{question}"),
    thoughts=THOUGHTS,
    hop_queries=lambda plan: list(plan.queries),
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
        reward="agents.search_r1:reward",
        needs=frozenset({"retriever"}),
        roles=(POLICY,),
        demonstrations=DEMONSTRATIONS,
        description="one policy: think, search the retriever, answer (Search-R1)",
    ),
    Agent(
        "thinker-searcher",
        run_thinker,
        reward="agents.search_r1:reward",
        needs=frozenset({"searcher"}),
        roles=(THINKER,),
        params=SearchR1Params,
        demonstrations=DEMONSTRATIONS,
        description="a trained Thinker delegates searches to the frozen searcher service",
    ),
)


def search_r1_reward(
    answer: str | None,
    golds: str | Iterable[str],
    *,
    action_text: str = "",
    information: Sequence[str] = (),
    metric: AnswerMetric = "em",
    structure_format_score: float = 0.0,
    final_format_score: float = 0.0,
    retrieval_score: float = 0.0,
) -> RewardResult:
    """Search-R1: the ``metric`` score of the ``answer`` (0 when ``None``); with all shaping weights at 0
    (the default) that is all.

    ``valid`` = the strict sequence validator on ``action_text`` (the policy's turns with each observation
    as an empty block, ``TokenTrajectory.action_text``); ``hit`` = a gold appears (sub-EM) in one of the
    retrieved ``information`` contents. With shaping (Search-R1's format variant, qa_em_format; e.g. structure 0.2,
    final 0.1):
      correct & valid → s;  correct & invalid → s − structure;  wrong & valid → structure (+ retrieval if hit);
      wrong & invalid → final (0 when there is no answer at all).
    """
    base = answer_reward(answer, golds, metric)
    valid = is_valid_sequence(action_text, POLICY.name)
    hit = any(sub_exact_match(block, golds) for block in information)
    components = {**base.components, "valid_format": float(valid), "retrieval_hit": float(hit)}
    if structure_format_score == final_format_score == retrieval_score == 0.0:
        return RewardResult(reward=base.reward, components=components)
    if base.reward > 0:
        reward = base.reward if valid else base.reward - structure_format_score
    elif valid:
        reward = structure_format_score + (retrieval_score if hit else 0.0)
    else:
        reward = final_format_score if components["has_answer"] else 0.0
    return RewardResult(reward=reward, components=components)
