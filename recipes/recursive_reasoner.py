"""The recursive math reasoner: a trained JSON planner decomposes a word problem, a frozen worker solves it.

Reward: correctness of the worker's final number, token efficiency and the independence of the subproblems
(0.1 when the plan does not parse). Eval adds numeric accuracy.
"""

from __future__ import annotations

from recipes.base import Recipe, Scoring, episode_reward
from shared.agents.context import Episode
from shared.agents.recursive_reasoner import ReasonerFacts, run_recursive_reasoner
from shared.answers import numeric_match
from shared.datasets import PromptRecord
from shared.rewards.recipes import recursive_reasoner_reward
from shared.rewards.result import RewardResult
from shared.rewards.similarity import subproblem_independence


@episode_reward
def reward(episode: Episode, scoring: Scoring) -> RewardResult:
    facts: ReasonerFacts = episode.facts
    golds = scoring.record.golden_answers
    independence = subproblem_independence(list(facts.subproblems), scoring.embed) if facts.decomposed else 0.5
    return recursive_reasoner_reward(
        parsed=facts.parsed, correct=bool(numeric_match(episode.answer, golds[0] if golds else "")),
        tokens=facts.planner_tokens + facts.worker_tokens, decomposed=facts.decomposed,
        independence=independence, token_budget=scoring.settings.token_budget)


def numeric(record: PromptRecord, answer: str | None) -> dict[str, float]:
    golds = record.golden_answers
    return {"numeric": numeric_match(answer, golds[0]) if golds else 0.0}


RECIPES = (
    Recipe("recursive-reasoner", run_recursive_reasoner, reward="recipes.recursive_reasoner:reward",
           needs=frozenset({"frozen"}), roles=("planner",), answer_extras=numeric,
           description="a JSON planner decomposes math problems for a frozen worker"),
)
