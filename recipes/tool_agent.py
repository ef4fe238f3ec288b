"""The tool-calling agent: the model calls a ``search`` tool in its chat template's tool-call format.

Reward: MRR of the retrieved gold documents, answer similarity and the think-format fraction, weighted
(``tool_reward_weights``), or re-combined per group (``reward_combination``: uniform, std, PCA, L2).
"""

from __future__ import annotations

from typing import Any

from recipes.base import Recipe, Scoring, episode_reward
from shared.agents.context import Episode
from shared.agents.tool_agent import chat, run_tool_agent
from shared.datasets import gold_doc_ids
from shared.rewards.combine import combine_rewards
from shared.rewards.efficiency import think_format_fraction
from shared.rewards.recipes import tool_agent_reward
from shared.rewards.result import RewardResult
from shared.rewards.similarity import answer_similarity

COMPONENTS = ("mrr", "answer_similarity", "format")


@episode_reward
def reward(episode: Episode, scoring: Scoring) -> RewardResult:
    golds = scoring.record.golden_answers
    similarity = answer_similarity(episode.answer, golds[0] if golds else "", scoring.embed)
    return tool_agent_reward(retrieved_ids=[list(ids) for ids in episode.search.retrieved_ids],
                             gold_doc_ids=gold_doc_ids(scoring.record), similarity=similarity,
                             think_fraction=think_format_fraction(chat(episode.main)),
                             weights=scoring.settings.tool_reward_weights)


def combine_group(settings: Any, rewards: list[RewardResult]) -> list[RewardResult]:
    """A group-level scheme (uniform/std/PCA/L2) re-combines the group's components; the weights each got
    are kept as ``weight_<name>`` components. ``explicit``: unchanged."""
    if settings.reward_combination == "explicit":
        return rewards
    combined = combine_rewards({k: [r.components[k] for r in rewards] for k in COMPONENTS},
                               settings.reward_combination)
    weights = {f"weight_{k}": w for k, w in combined.weights.items()}
    return [RewardResult(reward=float(value), components={**r.components, **weights})
            for r, value in zip(rewards, combined.rewards, strict=True)]


RECIPES = (
    Recipe("tool-agent", run_tool_agent, reward="recipes.tool_agent:reward", needs=frozenset({"retriever"}),
           combine=combine_group, description="chat-template tool calls to a search tool"),
)
