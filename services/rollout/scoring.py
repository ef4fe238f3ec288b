"""Scores episodes with the recipe's reward and builds the published group.

The reward is the agent's own (``agents``) or the recipe TOML's ``[rollout] reward``; both are loaded by
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agents import Agent, Scoring, get_agent, load_reward
from agents.answers import answer_scores
from agents.core.episode import Episode, RewardResult
from agents.datasets import PromptRecord, gold_doc_ids
from services.rollout.config import RolloutSettings
from services.rollout.embedding import Embedder
from shared.protocol import TrajectoryGroup


@dataclass(frozen=True)
class Scorer:
    """The agent's reward, its answer metric and its group combination, resolved once from the settings (at
    start-up, not per episode): what scores every episode the rollout runs."""

    settings: RolloutSettings
    agent: Agent
    reward: Callable[[Episode, Scoring], RewardResult]
    metric: str  # the answer score the reward uses (the recipe's ``answer_metric``, else the agent's)
    embed: Embedder | None = None

    @classmethod
    def of(cls, settings: RolloutSettings, embed: Embedder | None = None) -> Scorer:
        return cls(settings, settings.agent_spec, load_reward(settings.reward_spec), settings.metric, embed)

    def score(self, record: PromptRecord, episode: Episode) -> RewardResult:
        scoring = Scoring(record=record, settings=self.settings, metric=self.metric, embed=self.embed)
        return self.reward(episode, scoring)

    def combine(self, rewards: list[RewardResult]) -> list[RewardResult]:
        """The agent's group-level re-combination of its rewards' components, if it has one (tool agent) and
        the recipe kept the agent's own reward."""
        combine = self.agent.combine
        return combine(self.settings, rewards) if combine is not None and self.settings.reward is None else rewards

    def answers(self, record: PromptRecord, answer: str | None) -> dict[str, float]:
        return answer_metrics(self.agent, record, answer)


def score_episode(settings: RolloutSettings, record: PromptRecord, episode: Episode, embed: Embedder) -> RewardResult:
    return Scorer.of(settings, embed).score(record, episode)


def combine_group(settings: RolloutSettings, rewards: list[RewardResult]) -> list[RewardResult]:
    return Scorer.of(settings).combine(rewards)


def answer_metrics(agent: str | Agent, record: PromptRecord, answer: str | None) -> dict[str, float]:
    """EM/F1 of an episode's final answer (and the agent's extra scores, e.g. numeric accuracy for math):
    what eval reports. ``agent``: the agent, or its name."""
    extras = (get_agent(agent) if isinstance(agent, str) else agent).answer_extras
    scores = answer_scores(answer, record.golden_answers)
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
    scorer: Scorer,
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
        answers = {f"answer_{k}": v for k, v in scorer.answers(record, episode.answer).items()}
        for traj in episode.trajectories:
            own = reward.for_trajectory(traj.sample_id)
            components = {**own.components, **{k: v for k, v in answers.items() if k not in own.components}}
            samples.append(traj.to_sample(own.reward, components, text=traj.response_text))
    return TrajectoryGroup(
        prompt_id=record.prompt_id,
        agent=scorer.settings.agent,
        data_source=record.data_source,
        question=record.question,
        golden_answers=list(record.golden_answers),
        policy_version=version,
        samples=samples,
        created_at=time.time(),
        timing=timing,
        metadata={"n_samples": len(episodes), "split": record.split},
    )
