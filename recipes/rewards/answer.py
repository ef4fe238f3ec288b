"""Answer rewards (EM/F1 of the episode's parsed answer, the CoDA affine mapping) live in ``recipes.answers``,
beside the normalisation they score with; this path is kept for recipes that name ``recipes.rewards.answer:…``."""

from recipes.answers import AnswerMetric, affine_answer_reward, answer_reward

__all__ = ["AnswerMetric", "affine_answer_reward", "answer_reward"]
