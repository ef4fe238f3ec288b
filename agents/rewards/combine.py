"""Combining several reward components into one reward, inside ONE prompt group. numpy only.

Input: K named components, each a vector over the group's n rollouts (matrix C, n × K). Schemes:
    explicit: R = C·w with the given weights
    uniform:  w_k = 1/K
    std:      w_k = σ_k / Σ_j σ_j (population σ within the group): components that separate the rollouts weigh
              more. When every σ is 0 nothing separates them: fall back to uniform (upstream divided 0 by 0).
    pca:      Z = column z-scores (population σ, + ε); R = Z·v with v the first principal component (unit
              loadings). An eigenvector's sign is arbitrary, so v is flipped when needed to make R correlate
              positively with the uniform sum Σ_k C_k (tie-break: Σ v ≥ 0) — otherwise the policy could be
              trained toward lower rewards (as upstream's could).
    l2:       R = sqrt(Σ_k C_k²)  (reported weights all 1)
``consistency_mask`` is the tool-calling agent's optional filter: keep rollouts whose every component lies on
the same side of its group mean.

"Upstream" is the tool-calling agent these schemes come from (``docs/upstream.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Scheme = Literal["explicit", "uniform", "std", "pca", "l2"]


@dataclass(frozen=True)
class Combined:
    """The combined reward per rollout and the weight each component got."""

    rewards: np.ndarray
    weights: dict[str, float]


def _matrix(components: Mapping[str, Sequence[float]]) -> tuple[list[str], np.ndarray]:
    names = list(components)
    if not names:
        raise ValueError("no reward components to combine")
    cols = [np.asarray(components[k], dtype=np.float64) for k in names]
    if len({c.shape for c in cols}) != 1 or cols[0].ndim != 1:
        raise ValueError("every reward component needs one value per rollout of the group")
    return names, np.stack(cols, axis=1)


def _pca(c: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(rewards, loadings) of the sign-anchored first principal component of the column z-scores."""
    k = c.shape[1]
    z = (c - c.mean(axis=0)) / (c.std(axis=0) + eps)
    if c.shape[0] < 2 or not np.any(z):
        return np.zeros(c.shape[0]), np.full(k, 1.0 / np.sqrt(k))
    _, _, vt = np.linalg.svd(z, full_matrices=False)
    v = vt[0]
    rewards = z @ v
    anchor = c.sum(axis=1)
    corr = float(np.dot(rewards - rewards.mean(), anchor - anchor.mean()))
    if corr < 0 or (np.isclose(corr, 0.0) and v.sum() < 0):
        v, rewards = -v, -rewards
    return rewards, v


def combine_rewards(
    components: Mapping[str, Sequence[float]],
    scheme: Scheme = "uniform",
    weights: Mapping[str, float] | None = None,
    eps: float = 1e-8,
) -> Combined:
    """Combine one group's reward components with ``scheme`` (formulas in the module docstring)."""
    names, c = _matrix(components)
    k = len(names)
    if scheme == "explicit":
        if weights is None or set(weights) - set(names):
            raise ValueError(f"explicit weights must name known components {names}, got {weights}")
        w = np.array([weights.get(n, 0.0) for n in names])
    elif scheme == "uniform":
        w = np.full(k, 1.0 / k)
    elif scheme == "std":
        sd = c.std(axis=0)
        w = sd / sd.sum() if sd.sum() > 0 else np.full(k, 1.0 / k)
    elif scheme == "pca":
        rewards, v = _pca(c, eps)
        return Combined(rewards, dict(zip(names, v.tolist(), strict=True)))
    elif scheme == "l2":
        return Combined(np.sqrt((c**2).sum(axis=1)), dict.fromkeys(names, 1.0))
    else:
        raise ValueError(f"unknown combination scheme {scheme!r}")
    return Combined(c @ w, dict(zip(names, w.tolist(), strict=True)))


def consistency_mask(components: Mapping[str, Sequence[float]]) -> np.ndarray:
    """True for rollouts whose components are all ≥ their group means or all ≤ them (ties count for both)."""
    _, c = _matrix(components)
    diff = c - c.mean(axis=0)
    return np.all(diff >= 0, axis=1) | np.all(diff <= 0, axis=1)
