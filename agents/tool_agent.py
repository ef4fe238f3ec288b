"""The tool-calling agent: OpenAI-style tool calls (hermes layout) to one ``search`` tool over the retriever.

The assistant turn stops at ``</tool_call>``; the call's JSON is parsed (``{"name": "search", "arguments":
{"query": ...}}``), only the first call of a turn is executed (as upstream's tool-calling agent did), and its
result is appended as a tool turn rendered by the model's chat template (``TokenizerLike.tool_turn``). A turn
that ends with EOS and no call is the final reply; the answer is the text after the last ``</think>``.

Reward: MRR of the retrieved gold documents, answer similarity and the think-format fraction, weighted
(``tool_reward_weights``), or re-combined per group (``reward_combination``: uniform, std, PCA, L2): the knobs
of ``ToolAgentParams``.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import Field

from agents.base import Agent, AgentParams, Scoring, episode_reward
from agents.core.episode import AgentContext, Episode, RewardResult, SearchTrace, TokenTrajectory
from agents.core.turns import Action, Observation, RoleSpec, run_turns
from agents.datasets import PromptRecord, gold_doc_ids
from agents.prompts import tool_agent_messages
from agents.rewards.combine import combine_rewards
from agents.rewards.efficiency import think_format_fraction
from agents.rewards.formulas import tool_agent_reward
from agents.rewards.similarity import answer_similarity
from shared.tags import THINK_CLOSE, TOOL_CALL_CLOSE, TOOL_CALL_OPEN

INVALID_TOOL_CALL = (
    '\nThe tool call was not valid JSON of the form {"name": "search", "arguments": '
    '{"query": "..."}}. Call the tool again or reply with the answer.\n'
)
FINAL_REPLY_NUDGE = "\nNo more tool calls are available. Reply with your answer now.\n"


class ToolAgentParams(AgentParams):
    """The tool agent's own knobs, [rollout.tool_agent] keys: how its reward's components combine."""

    table: ClassVar[str] = "tool_agent"

    tool_reward_weights: dict[str, float] = Field(
        default_factory=lambda: {"mrr": 1.0, "answer_similarity": 1.0, "format": 1.0},
        description="Tool agent: weights of mrr / answer_similarity / format",
    )
    reward_combination: Literal["explicit", "uniform", "std", "pca", "l2"] = Field(
        "explicit", description="Tool agent: how a group's components combine (explicit = tool_reward_weights)"
    )


def parse_tool_calls(text: str) -> list[Action]:
    """Complete ``<tool_call>`` blocks as ``Action("search", query)``; a malformed call is ``Action("bad", …)``."""
    out = []
    for block in text.split(TOOL_CALL_OPEN)[1:]:
        if TOOL_CALL_CLOSE not in block:
            continue
        raw = block.split(TOOL_CALL_CLOSE, 1)[0].strip()
        try:
            call = json.loads(raw)
            query = call["arguments"]["query"] if call.get("name") == "search" else None
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            query = None
        out.append(Action("search", str(query)) if isinstance(query, str) and query.strip() else Action("bad", raw))
    return out


def final_reply(text: str) -> str | None:
    reply = text.split(THINK_CLOSE)[-1].strip()
    return reply or None


async def run_tool_agent(ctx: AgentContext, record: PromptRecord) -> Episode:
    traj = TokenTrajectory(ctx.tok.render(tool_agent_messages(record.question)), role="policy")
    queries: list[str] = []
    retrieved: list[list[str]] = []

    async def act(actions: list[Action]) -> Observation:
        call = actions[0]
        if call.tag == "bad":
            content = INVALID_TOOL_CALL
        else:
            docs = (await ctx.retriever.retrieve([call.content], topk=ctx.topk))[0]
            queries.append(call.content)
            retrieved.append([d.id for d in docs])
            content = json.dumps({"ids": [d.id for d in docs], "documents": [d.contents for d in docs]})
        marker = "\x00"  # the content is the only truncatable part of the rendered tool turn
        before, _, after = ctx.tok.tool_turn(marker).partition(marker)
        return Observation(content=content, before=before, after=after, tag="tool_response", own_turn=True)

    spec = RoleSpec(
        actions=("search",),
        invalid_message=INVALID_TOOL_CALL,
        budget=ctx.budget("policy"),
        stop=(TOOL_CALL_CLOSE,),
        parse=parse_tool_calls,
        answer_on_eos=final_reply,
        final_message=FINAL_REPLY_NUDGE,
        final_stop=(TOOL_CALL_CLOSE,),
        env_frame=ctx.env_frame,  # its messages (invalid call, nudge); tool results are tool turns already
    )
    outcome = await run_turns(traj, ctx.policy, ctx.tok, spec, act)
    return Episode(
        main=traj, answer=outcome.answer, search=SearchTrace.of(queries, retrieved), invalid_turns=outcome.invalid_turns
    )


def chat(traj: TokenTrajectory) -> list[dict]:
    """The episode as chat messages for the format reward: every turn the model wrote (``assistant``) and
    every tool result (``tool``); the environment's messages (invalid call, final nudge) are nobody's turn."""
    return [
        {"role": "assistant", "content": s.text} if s.source == "generated" else {"role": "tool", "content": s.content}
        for s in traj.segments
        if s.source != "message"
    ]


COMPONENTS = ("mrr", "answer_similarity", "format")


@episode_reward
def reward(episode: Episode, scoring: Scoring) -> RewardResult:
    golds = scoring.record.golden_answers
    similarity = answer_similarity(episode.answer, golds[0] if golds else "", scoring.embed)
    return tool_agent_reward(
        retrieved_ids=[list(ids) for ids in episode.search.retrieved_ids],
        gold_doc_ids=gold_doc_ids(scoring.record),
        similarity=similarity,
        think_fraction=think_format_fraction(chat(episode.main)),
        weights=ToolAgentParams.of(scoring.settings).tool_reward_weights,
    )


def combine_group(settings: Any, rewards: list[RewardResult]) -> list[RewardResult]:
    """A group-level scheme (uniform/std/PCA/L2) re-combines the group's components; the weights each got
    are kept as ``weight_<name>`` components. ``explicit``: unchanged."""
    scheme = ToolAgentParams.of(settings).reward_combination
    if scheme == "explicit":
        return rewards
    combined = combine_rewards({k: [r.components[k] for r in rewards] for k in COMPONENTS}, scheme)
    weights = {f"weight_{k}": w for k, w in combined.weights.items()}
    return [
        RewardResult(reward=float(value), components={**r.components, **weights})
        for r, value in zip(rewards, combined.rewards, strict=True)
    ]


AGENTS = (
    Agent(
        "tool-agent",
        run_tool_agent,
        reward="agents.tool_agent:reward",
        needs=frozenset({"retriever"}),
        combine=combine_group,
        params=ToolAgentParams,
        description="chat-template tool calls to a search tool",
    ),
)
