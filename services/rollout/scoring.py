"""Scores episodes with the recipe's reward (``shared.rewards.recipes``) and builds the published group.

Rewards are per episode; a CoDA episode's reward goes to its planner and every executor it spawned (the
seed's rule). Rewards read the episode's parsed answer (the one eval scores, ``answer_metrics``), the
policy's own turns and the observations' contents, never the whole response text: the environment's
messages in it spell out ``<answer> and </answer>``. Every sample also carries the reward's named
components, so the trainer and the dashboards see what the scalar was made of.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from services.rollout.config import RolloutSettings
from services.rollout.embedding import Embedder
from shared.agents.context import Episode
from shared.answers import answer_scores, numeric_match
from shared.datasets import PromptRecord, gold_doc_ids
from shared.protocol import TrajectoryGroup
from shared.rewards.combine import combine_rewards
from shared.rewards.efficiency import think_format_fraction
from shared.rewards.recipes import (
    ExecutorRun,
    coda_reward,
    recursive_reasoner_reward,
    search_r1_reward,
    tool_agent_reward,
)
from shared.rewards.result import RewardResult
from shared.rewards.similarity import answer_similarity, subproblem_independence


def score_episode(settings: RolloutSettings, record: PromptRecord, episode: Episode,
                  embed: Embedder) -> RewardResult:
    recipe, golds = settings.agent, record.golden_answers
    if recipe in ("search-r1", "thinker-searcher"):
        return search_r1_reward(episode.answer, golds, action_text=episode.main.action_text,
                                information=episode.main.observations("information"), metric=settings.metric)
    if recipe in ("coda", "red-coda"):
        executors = [ExecutorRun(c.generated_text, c.observations("documents")) for c in episode.children]
        return coda_reward(episode.answer, episode.main.generated_text, executors, golds, metric=settings.metric,
                           format_weight=settings.format_weight, refine_weight=settings.refine_weight)
    if recipe == "recursive-reasoner":
        info = episode.info
        independence = subproblem_independence(info["subproblems"], embed) if info["decomposed"] else 0.5
        return recursive_reasoner_reward(
            parsed=info["parsed"], correct=bool(numeric_match(episode.answer, golds[0] if golds else "")),
            tokens=info["planner_tokens"] + info["worker_tokens"], decomposed=info["decomposed"],
            independence=independence, token_budget=settings.token_budget)
    if recipe == "tool-agent":
        similarity = answer_similarity(episode.answer, golds[0] if golds else "", embed)
        return tool_agent_reward(retrieved_ids=episode.info["retrieved_ids"], gold_doc_ids=gold_doc_ids(record),
                                 similarity=similarity,
                                 think_fraction=think_format_fraction(episode.info["messages"]),
                                 weights=settings.tool_reward_weights)
    raise ValueError(f"no reward for recipe {recipe!r}")


TOOL_COMPONENTS = ("mrr", "answer_similarity", "format")


def combine_group(settings: RolloutSettings, rewards: list[RewardResult]) -> list[RewardResult]:
    """Tool agent with a group-level scheme (uniform/std/PCA/L2): re-combine the group's components; the
    weights each component got are kept as ``weight_<name>`` components. Other recipes: unchanged."""
    if settings.agent != "tool-agent" or settings.reward_combination == "explicit":
        return rewards
    combined = combine_rewards({k: [r.components[k] for r in rewards] for k in TOOL_COMPONENTS},
                               settings.reward_combination)
    weights = {f"weight_{k}": w for k, w in combined.weights.items()}
    return [RewardResult(reward=float(value), components={**r.components, **weights})
            for r, value in zip(rewards, combined.rewards, strict=True)]


def answer_metrics(recipe: str, record: PromptRecord, answer: str | None) -> dict[str, float]:
    """EM/F1 (and numeric accuracy for math) of an episode's final answer: what eval reports."""
    scores = answer_scores(answer, record.golden_answers)
    if recipe == "recursive-reasoner":
        scores["numeric"] = numeric_match(answer, record.golden_answers[0]) if record.golden_answers else 0.0
    return scores


def search_metrics(record: PromptRecord, episode: Episode | None) -> dict[str, float]:
    """How well the first well-formed search went, where the dataset says what a good one is.

    ``search_entity``: the first query names the entity the question is about (lookup world metadata);
    ``search_hit``: the first search retrieved a gold document. Episodes that never searched score 0.
    """
    out: dict[str, float] = {}
    info = episode.info if episode is not None else {}
    entity = record.metadata.get("entity")
    if entity:
        queries = info.get("queries") or []
        out["search_entity"] = float(bool(queries) and entity.lower() in queries[0].lower())
    gold = set(gold_doc_ids(record))
    if gold:
        retrieved = info.get("retrieved_ids") or []
        out["search_hit"] = float(bool(retrieved) and bool(gold & {str(i) for i in retrieved[0]}))
    return out


def build_group(settings: RolloutSettings, record: PromptRecord, episodes: Sequence[Episode],
                rewards: Sequence[RewardResult], *, version: int, timing: dict[str, float]) -> TrajectoryGroup:
    samples = []
    for episode, reward in zip(episodes, rewards, strict=True):
        components = {**reward.components, **{f"answer_{k}": v for k, v in
                                               answer_metrics(settings.agent, record, episode.answer).items()
                                               if f"answer_{k}" not in reward.components}}
        for traj in episode.trajectories:
            samples.append(traj.to_sample(reward.reward, components, text=traj.response_text))
    return TrajectoryGroup(prompt_id=record.prompt_id, recipe=settings.agent, data_source=record.data_source,
                           question=record.question, golden_answers=list(record.golden_answers),
                           policy_version=version, samples=samples, created_at=time.time(), timing=timing,
                           metadata={"n_samples": len(episodes), "split": record.split})
