"""Scores episodes with the recipe's reward and builds the published group.

The reward is the agent's own (``recipes``) or the recipe TOML's ``[rollout] reward``; both are loaded by
name once. Rewards are per episode: the episode's reward goes to each of its trajectories, except those the
reward scored on their own (``RewardResult.per_trajectory``, keyed by sample id), which get their own reward
and components. CoDA's per-role reward gives each executor its own (the planner takes the episode's); in its
``shared`` mode the episode's goes to the planner and every executor it spawned. Rewards read the episode's
parsed answer (the one eval scores, ``answer_metrics``), the policy's own turns, the observations' contents
and the typed episode facts, never the whole response text: the environment's messages in it spell out
``<answer> and </answer>``. Every sample also carries the reward's (its own, where it has one) named
components and the episode's final-answer metrics (``answer_*``), so the trainer and the dashboards see what
the scalar was made of.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from recipes import Scoring, get_agent, load_reward
from recipes.answers import answer_scores
from recipes.core.context import Episode, RewardResult
from recipes.datasets import PromptRecord, gold_doc_ids
from services.rollout.config import RolloutSettings
from services.rollout.embedding import Embedder
from shared.protocol import TrajectoryGroup


def score_episode(settings: RolloutSettings, record: PromptRecord, episode: Episode, embed: Embedder) -> RewardResult:
    reward = load_reward(settings.reward_spec)
    return reward(episode, Scoring(record=record, settings=settings, metric=settings.metric, embed=embed))


def combine_group(settings: RolloutSettings, rewards: list[RewardResult]) -> list[RewardResult]:
    """The recipe's group-level re-combination of its rewards' components, if it has one (tool agent)."""
    combine = settings.agent_spec.combine
    return combine(settings, rewards) if combine is not None and settings.reward is None else rewards


def answer_metrics(agent: str, record: PromptRecord, answer: str | None) -> dict[str, float]:
    """EM/F1 of an episode's final answer (and the recipe's extra scores, e.g. numeric accuracy for math):
    what eval reports."""
    scores = answer_scores(answer, record.golden_answers)
    extras = get_agent(agent).answer_extras
    return {**scores, **extras(record, answer)} if extras is not None else scores


def search_metrics(record: PromptRecord, episode: Episode | None) -> dict[str, float]:
    """How well the first well-formed search went, where the dataset says what a good one is.

    ``search_entity``: the first query names the entity the question is about (lookup world metadata);
    ``search_hit``: the first search retrieved a gold document. Episodes that never searched score 0.
    """
    out: dict[str, float] = {}
    trace = episode.search if episode is not None else None
    entity = record.metadata.get("entity")
    if entity:
        queries = trace.queries if trace else ()
        out["search_entity"] = float(bool(queries) and entity.lower() in queries[0].lower())
    gold = set(gold_doc_ids(record))
    if gold:
        retrieved = trace.retrieved_ids if trace else ()
        out["search_hit"] = float(bool(retrieved) and bool(gold & set(retrieved[0])))
    return out


def build_group(
    settings: RolloutSettings,
    record: PromptRecord,
    episodes: Sequence[Episode],
    rewards: Sequence[RewardResult],
    *,
    version: int,
    timing: dict[str, float],
) -> TrajectoryGroup:
    samples = []
    for episode, reward in zip(episodes, rewards, strict=True):
        # The episode's final-answer metrics go on every sample of it, as eval reports them per episode.
        answers = {f"answer_{k}": v for k, v in answer_metrics(settings.agent, record, episode.answer).items()}
        for traj in episode.trajectories:
            own = reward.for_trajectory(traj.sample_id)
            components = {**own.components, **{k: v for k, v in answers.items() if k not in own.components}}
            samples.append(traj.to_sample(own.reward, components, text=traj.response_text))
    return TrajectoryGroup(
        prompt_id=record.prompt_id,
        agent=settings.agent,
        data_source=record.data_source,
        question=record.question,
        golden_answers=list(record.golden_answers),
        policy_version=version,
        samples=samples,
        created_at=time.time(),
        timing=timing,
        metadata={"n_samples": len(episodes), "split": record.split},
    )
