"""The flat Search-R1 recipe (one policy searches and answers) and its Thinker variant (``thinker-searcher``:
the Thinker's searches go to the frozen searcher service, which summarises what it found).

Reward: the answer's score (EM by default), with Search-R1's structure-format shaping; it reads the parsed
answer, the policy's own action text and the ``<information>`` observations only.
"""

from __future__ import annotations

from recipes.base import Recipe, Scoring, episode_reward
from shared.agents.context import Episode
from shared.agents.search_r1 import run_search_r1, run_thinker
from shared.rewards.recipes import search_r1_reward
from shared.rewards.result import RewardResult


@episode_reward
def reward(episode: Episode, scoring: Scoring) -> RewardResult:
    return search_r1_reward(episode.answer, scoring.record.golden_answers, action_text=episode.main.action_text,
                            information=episode.main.observations("information"), metric=scoring.metric)


RECIPES = (
    Recipe("search-r1", run_search_r1, reward="recipes.search_r1:reward", needs=frozenset({"retriever"}),
           roles=("policy",), demonstrations="search",
           description="one policy: think, search the retriever, answer (Search-R1)"),
    Recipe("thinker-searcher", run_thinker, reward="recipes.search_r1:reward", needs=frozenset({"searcher"}),
           roles=("thinker",), demonstrations="search", description="a trained Thinker delegates searches to the frozen searcher service"),
)
