"""Embedding-based rewards: answer similarity and subproblem independence.

The embedder is passed in as a callable ``embed(texts) -> array (len(texts), dim)``, so these stay pure and the
caller chooses the model (e.g. sentence-transformers MiniLM, with e5 ``query: `` prefixes if it wants them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Embedder = Callable[[list[str]], np.ndarray]


def cosine(a: np.ndarray, b: np.ndarray, eps: float = 1e-12) -> float:
    """``a·b / (‖a‖·‖b‖)``; 0.0 when either vector is zero."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / denom) if denom > eps else 0.0


def answer_similarity(prediction: str | None, reference: str, embed: Embedder) -> float:
    """``max(0, cos(embed(prediction), embed(reference)))``; 0.0 for a missing or blank prediction."""
    if prediction is None or not prediction.strip():
        return 0.0
    vectors = np.asarray(embed([prediction, reference]))
    return max(0.0, cosine(vectors[0], vectors[1]))


def subproblem_independence(subproblems: Sequence[str], embed: Embedder, single_value: float = 0.5) -> float:
    """``1 − mean_{i<j} cos(e_i, e_j)`` over the subproblems' embeddings; ``single_value`` (0.5) for fewer than 2."""
    if len(subproblems) < 2:
        return single_value
    vectors = np.asarray(embed(list(subproblems)), dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = vectors / np.where(norms > 0, norms, 1.0)
    sims = unit @ unit.T
    upper = sims[np.triu_indices(len(subproblems), k=1)]
    return float(1.0 - upper.mean())
