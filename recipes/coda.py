"""CoDA: a Planner delegates sub-questions to ephemeral Executors that search and answer; one model plays both
roles and both are trained (``red-coda`` is the same agent: RED changes only the trainer's SFT weighting).

Reward: ``(6·F1 − 3)`` of the planner's answer plus format and refine terms (``shared.rewards.recipes``); the
same value goes to the planner and every executor it spawned.
"""

from __future__ import annotations

from recipes.base import Recipe, Scoring, episode_reward
from shared.agents.coda import run_coda
from shared.agents.context import Episode
from shared.rewards.recipes import ExecutorRun, coda_reward
from shared.rewards.result import RewardResult


@episode_reward
def reward(episode: Episode, scoring: Scoring) -> RewardResult:
    s = scoring.settings
    executors = [ExecutorRun(c.generated_text, c.observations("documents")) for c in episode.children]
    return coda_reward(episode.answer, episode.main.generated_text, executors, scoring.record.golden_answers,
                       metric=scoring.metric, format_weight=s.format_weight, refine_weight=s.refine_weight)


_CODA = dict(run=run_coda, reward="recipes.coda:reward", needs=frozenset({"retriever"}),
             roles=("planner", "executor"), metric="f1", demonstrations="coda")
RECIPES = (
    Recipe("coda", **_CODA, description="a planner delegates sub-questions to executors that search"),
    Recipe("red-coda", **_CODA, description="CoDA with RED-weighted SFT co-training (the trainer's side)"),
)
