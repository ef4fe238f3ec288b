"""Answer rewards: match scores of the episode's answer against the golds, and the CoDA affine mapping.

The answer is the one the agent parsed from the policy's own turn (``Episode.answer``), the same one eval
scores. It is never re-extracted from the response text: that text holds the environment's messages too,
which spell out ``<answer> and </answer>``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from recipes.answers import answer_scores
from recipes.rewards.result import RewardResult

AnswerMetric = Literal["em", "sub_em", "cover_em", "f1"]


def affine_answer_reward(score: float, scale: float = 6.0, shift: float = -3.0) -> float:
    """``scale·score + shift``; CoDA's ``6·F1 − 3`` maps F1 ∈ [0, 1] onto [−3, 3] (F1 = 0.5 ↦ 0)."""
    return scale * score + shift


def answer_reward(answer: str | None, golds: str | Iterable[str], metric: AnswerMetric = "em") -> RewardResult:
    """Score the episode's ``answer`` with ``metric`` (max over golds); 0 when there is none (``None``).

    Components: ``em``, ``sub_em``, ``cover_em``, ``f1`` (all logged whatever the metric) and ``has_answer``.
    """
    scores = answer_scores(answer, golds)
    components = {**scores, "has_answer": float(answer is not None)}
    return RewardResult(reward=scores[metric], components=components)
