"""Reward functions: pure Python/numpy, no torch, no network of their own (clients and embedders are passed in).

Modules: ``answer`` (EM/F1 rewards and the 6·F1−3 mapping), ``format`` (per-tag score, strict sequence
validator), ``retrieval`` (refine, information reverse-rank, MRR), ``similarity`` (embedding cosine,
subproblem independence), ``efficiency`` (token efficiency, length penalty, think fraction),
``planner_json`` (tolerant JSON-plan parsing), ``formulas`` (one reward per agent),
``combine`` (reward combination inside a prompt group). Answer normalisation lives in ``recipes.answers``.
Every agent's reward returns a ``RewardResult``: the scalar and its named components.
"""

from recipes.core.context import RewardResult

__all__ = ["RewardResult"]
