"""Hybrid fusion of a dense and a sparse top-k list: pure functions over numpy arrays.

Inputs are candidate lists per query, best first: ``ids`` (int64, ``-1`` = no candidate in that slot) and
``scores`` (float) of shape ``(n_queries, depth)``. The two sides may have different depths.

- ``minmax`` (default): each side's candidate scores are mapped to [0, 1] by (s − min) / (max − min); the
  fused score is ``w·sparse + (1 − w)·dense`` (a convex combination, Bruch et al. 2023).
- ``zscore``: the same combination over (s − mean) / std.
- ``rrf``: reciprocal rank fusion, ``Σ 1 / (k + rank)`` with ranks from 1 (Cormack et al. 2009, k = 60).

A document missing from one side's candidates gets that side's lowest normalised value (0 for min-max, the
smallest z for z-score; nothing for RRF): being outside the top-depth is evidence it scored at most that.
A side whose candidates all score the same carries no ranking signal; min-max maps it to 1.0 (every
candidate equally good), z-score to 0.0. Ties in the fused score keep the smaller document id first, so the
output is deterministic.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

FusionMethod = Literal["minmax", "rrf", "zscore"]


def minmax_normalize(scores: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Row-wise (s − min) / (max − min) over the valid entries; 1.0 where max == min; 0 where invalid."""
    s = scores.astype(np.float64)
    lo = np.where(valid, s, np.inf).min(1, keepdims=True)
    hi = np.where(valid, s, -np.inf).max(1, keepdims=True)
    span = hi - lo  # -inf for a row with no valid entry; masked out below
    safe = np.where(span > 0, span, 1.0)
    out = np.where(span > 0, (s - np.where(np.isfinite(lo), lo, 0.0)) / safe, 1.0)
    return np.where(valid, out, 0.0)


def zscore_normalize(scores: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Row-wise (s − mean) / std (population std) over the valid entries; 0 where std == 0 or invalid."""
    s = np.where(valid, scores, 0.0).astype(np.float64)
    n = np.maximum(valid.sum(1, keepdims=True), 1)
    mean = s.sum(1, keepdims=True) / n
    var = (np.where(valid, s - mean, 0.0) ** 2).sum(1, keepdims=True) / n
    std = np.sqrt(var)
    out = np.where(std > 0, (s - mean) / np.where(std > 0, std, 1.0), 0.0)
    return np.where(valid, out, 0.0)


def rrf_scores(ids: np.ndarray, k: float) -> np.ndarray:
    """1 / (k + rank) with rank = slot + 1 for valid slots (lists are best first); 0 where invalid."""
    ranks = np.arange(1, ids.shape[1] + 1, dtype=np.float64)
    return np.where(ids >= 0, 1.0 / (k + ranks), 0.0)


def _missing_value(norm: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Per row: the lowest normalised value among the valid candidates (0 for a row with none)."""
    lowest = np.where(valid, norm, np.inf).min(1, keepdims=True)
    return np.where(np.isfinite(lowest), lowest, 0.0)


def merge_by_id(
    ids_a: np.ndarray, part_a: np.ndarray, miss_a: np.ndarray, ids_b: np.ndarray, part_b: np.ndarray, miss_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Union of two candidate lists per row, summing each id's parts (a missing side contributes miss_x).

    Returns ``(ids, fused)`` of width ``a + b``: each id appears once, duplicates become ``-1`` / ``-inf``.
    Ids within one list must be unique (true for any top-k list).
    """
    ids = np.concatenate([ids_a, ids_b], axis=1)
    # Each candidate starts as (its own part + the other side's missing value); when the id is on both
    # sides the pair is merged below into part_a + part_b.
    fused = np.concatenate([part_a + miss_b, part_b + miss_a], axis=1)
    own = np.concatenate([part_a, part_b], axis=1)
    order = np.argsort(np.where(ids >= 0, ids, np.iinfo(np.int64).max), axis=1, kind="stable")
    ids, fused, own = (np.take_along_axis(x, order, 1) for x in (ids, fused, own))
    dup = (ids[:, 1:] == ids[:, :-1]) & (ids[:, 1:] >= 0)  # slot j+1 repeats slot j: one from each side
    fused[:, :-1] = np.where(dup, own[:, :-1] + own[:, 1:], fused[:, :-1])
    drop = np.zeros_like(ids, bool)
    drop[:, 1:] = dup
    invalid = drop | (ids < 0)
    return np.where(invalid, -1, ids), np.where(invalid, -np.inf, fused)


def top_k(ids: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (score descending, id ascending on ties) per row; slots past the valid ones are -1/-inf."""
    tie = np.where(ids >= 0, ids, np.iinfo(np.int64).max)
    order = np.lexsort((tie, -scores), axis=1)[:, :k]
    return np.take_along_axis(ids, order, 1), np.take_along_axis(scores, order, 1)


def fuse(
    dense_ids: np.ndarray,
    dense_scores: np.ndarray,
    sparse_ids: np.ndarray,
    sparse_scores: np.ndarray,
    k: int,
    method: FusionMethod = "minmax",
    sparse_weight: float = 0.5,
    rrf_k: float = 60.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Fuse the dense and sparse candidate lists of each query into its top-``k`` (ids, fused scores)."""
    dense_ok, sparse_ok = dense_ids >= 0, sparse_ids >= 0
    if method == "rrf":
        d, s = rrf_scores(dense_ids, rrf_k), rrf_scores(sparse_ids, rrf_k)
        miss_d = miss_s = np.zeros((len(dense_ids), 1))
    elif method in ("minmax", "zscore"):
        normalize = minmax_normalize if method == "minmax" else zscore_normalize
        d = (1.0 - sparse_weight) * normalize(dense_scores, dense_ok)
        s = sparse_weight * normalize(sparse_scores, sparse_ok)
        miss_d, miss_s = _missing_value(d, dense_ok), _missing_value(s, sparse_ok)
    else:
        raise ValueError(f"unknown fusion method {method!r}; expected minmax, rrf or zscore")
    ids, fused = merge_by_id(dense_ids, d, miss_d, sparse_ids, s, miss_s)
    return top_k(ids, fused, k)
