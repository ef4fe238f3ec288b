"""Answer rewards: match scores of the final ``<answer>`` against the golds, and the CoDA affine mapping."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from shared.answers import answer_scores, extract_answer
from shared.rewards.result import RewardResult

AnswerMetric = Literal["em", "sub_em", "cover_em", "f1"]


def affine_answer_reward(score: float, scale: float = 6.0, shift: float = -3.0) -> float:
    """``scale·score + shift``; CoDA's ``6·F1 − 3`` maps F1 ∈ [0, 1] onto [−3, 3] (F1 = 0.5 ↦ 0)."""
    return scale * score + shift


def answer_reward(response: str, golds: str | Iterable[str], metric: AnswerMetric = "em") -> RewardResult:
    """Score the last ``<answer>`` of ``response`` with ``metric`` (max over golds); 0 when there is none.

    Components: ``em``, ``sub_em``, ``cover_em``, ``f1`` (all logged whatever the metric) and ``has_answer``.
    """
    prediction = extract_answer(response)
    scores = answer_scores(prediction, golds)
    components = {**scores, "has_answer": float(prediction is not None)}
    return RewardResult(reward=scores[metric], components=components)
