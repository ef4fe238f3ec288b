"""Single-turn: one completion of the prompt, no tools (the plain GRPO task: a prompt, a completion, a reward).

The prompt is the row's prompt field rendered as one user turn by the model's chat template (with the recipe's
``system_prompt`` before it when set, as for every agent); generation stops at EOS, at the
``[rollout.single_turn] stop`` strings (``SingleTurnParams``; naive-rag's one turn too) or at
``max_tokens_per_turn``. The completion is the episode's answer. The default reward scores it against the gold
answers with the answer metric; a user reward (``[rollout] reward = "module:function"``) replaces it.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from agents.answers import answer_reward
from agents.base import Agent, AgentParams, Scoring, episode_reward
from agents.core.episode import AgentContext, Episode, RewardResult, TokenTrajectory
from agents.core.llm import whole_tokens
from agents.datasets import PromptRecord
from agents.prompts import Messages


class SingleTurnParams(AgentParams):
    """The one-turn agents' own knob, a [rollout.single_turn] key: single-turn's and naive-rag's stop strings."""

    table: ClassVar[str] = "single_turn"

    stop: list[str] = Field(default_factory=list, description="single-turn, naive-rag: stop strings (EOS always stops)")


async def complete_once(ctx: AgentContext, record: PromptRecord, messages: Messages) -> tuple[TokenTrajectory, str]:
    """One policy completion of ``messages`` within the policy's budget; the trajectory and the text."""
    traj = TokenTrajectory(ctx.tok.render(messages), role="policy")
    budget = ctx.budget("policy")
    room = budget.max_context_tokens - traj.prompt_len
    if room <= 0:
        raise ValueError(
            f"prompt {record.prompt_id} is {traj.prompt_len} tokens: no room under "
            f"max_context_tokens={budget.max_context_tokens}"
        )
    gen = await ctx.policy.generate(traj.next_prompt(), stop=list(ctx.stop), max_tokens=min(budget.max_tokens, room))
    gen = whole_tokens(gen, ctx.tok)
    traj.add_generation(gen)
    traj.finish_reason = "length" if gen.finish_reason == "length" else "stop"
    return traj, gen.text


async def run_single_turn(ctx: AgentContext, record: PromptRecord) -> Episode:
    traj, text = await complete_once(ctx, record, [{"role": "user", "content": record.question}])
    return Episode(main=traj, answer=text.strip() or None)


@episode_reward
def reward(episode: Episode, scoring: Scoring) -> RewardResult:
    """The answer metric of the completion against the gold answers (all answer scores as components)."""
    return answer_reward(episode.answer, scoring.record.golden_answers, metric=scoring.metric)


AGENTS = (
    Agent(
        "single-turn",
        run_single_turn,
        reward="agents.single_turn:reward",
        params=SingleTurnParams,
        description="one completion per prompt, no tools; bring your own reward",
    ),
)
