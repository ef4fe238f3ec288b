"""Fusion functions against scores worked out by hand (numbers in the comments)."""

from __future__ import annotations

import numpy as np
import pytest

from services.retriever.fusion import fuse, merge_by_id, minmax_normalize, rrf_scores, top_k, zscore_normalize

# Dense: docs 1, 2, 3 with cosine .9 .7 .5. Sparse: docs 3, 4 with BM25 10, 6, and one empty slot.
DENSE_IDS, DENSE = np.array([[1, 2, 3]]), np.array([[0.9, 0.7, 0.5]])
SPARSE_IDS, SPARSE = np.array([[3, 4, -1]]), np.array([[10.0, 6.0, -np.inf]])


def test_minmax_normalize_by_hand():
    # (s - .5) / .4 -> 1, .5, 0 ; the invalid slot is 0 ; equal scores -> 1.0
    out = minmax_normalize(np.array([[0.9, 0.7, 0.5, 7.0]]), np.array([[True, True, True, False]]))
    np.testing.assert_allclose(out, [[1.0, 0.5, 0.0, 0.0]])
    np.testing.assert_allclose(minmax_normalize(np.array([[2.0, 2.0]]), np.array([[True, True]])), [[1, 1]])
    assert minmax_normalize(np.array([[1.0]]), np.array([[False]])).tolist() == [[0.0]]


def test_zscore_normalize_by_hand():
    # mean .7, population std sqrt(.08/3) = .163299 -> z = ±1.224745
    out = zscore_normalize(DENSE, np.ones_like(DENSE, bool))
    np.testing.assert_allclose(out, [[1.224745, 0.0, -1.224745]], atol=1e-6)
    np.testing.assert_allclose(zscore_normalize(np.array([[3.0, 3.0]]), np.array([[True, True]])), [[0, 0]])


def test_rrf_scores_by_hand():
    np.testing.assert_allclose(rrf_scores(np.array([[5, 9, -1]]), 60), [[1 / 61, 1 / 62, 0.0]])


def test_minmax_equal_weights_ties_broken_by_id():
    # dense parts .5·(1, .5, 0) = .5 .25 0 ; sparse parts .5·(1, 0) = .5 0
    # fused: doc1 .5, doc2 .25, doc3 0 + .5 = .5, doc4 0 -> [1, 3, 2] (1 before 3 on the tie)
    ids, scores = fuse(DENSE_IDS, DENSE, SPARSE_IDS, SPARSE, k=3, method="minmax", sparse_weight=0.5)
    assert ids.tolist() == [[1, 3, 2]]
    np.testing.assert_allclose(scores, [[0.5, 0.5, 0.25]])


def test_minmax_sparse_weight_07():
    # dense .3·(1, .5, 0) = .3 .15 0 ; sparse .7·(1, 0) = .7 0 -> doc3 .7, doc1 .3, doc2 .15, doc4 0
    ids, scores = fuse(DENSE_IDS, DENSE, SPARSE_IDS, SPARSE, k=10, method="minmax", sparse_weight=0.7)
    valid = ids[0] >= 0
    assert ids[0][valid].tolist() == [3, 1, 2, 4]
    np.testing.assert_allclose(scores[0][valid], [0.7, 0.3, 0.15, 0.0])
    assert not valid[4:].any()  # width is 6 (3 + 3); the two duplicate/empty slots are dropped


def test_rrf_by_hand():
    # doc3: 1/63 + 1/61 = .032266 ; doc1 1/61 ; doc2 1/62 ; doc4 1/62 (tie -> id 2 first)
    ids, scores = fuse(DENSE_IDS, DENSE, SPARSE_IDS, SPARSE, k=4, method="rrf", rrf_k=60)
    assert ids.tolist() == [[3, 1, 2, 4]]
    np.testing.assert_allclose(scores, [[1 / 63 + 1 / 61, 1 / 61, 1 / 62, 1 / 62]])


def test_zscore_missing_side_gets_that_sides_lowest():
    # dense parts .5·(1.224745, 0, -1.224745); sparse parts .5·(1, -1); missing dense = -.612372,
    # missing sparse = -.5. doc1 .612372 - .5 = .112372 ; doc3 -.612372 + .5 = -.112372 ;
    # doc2 0 - .5 = -.5 ; doc4 -.5 - .612372 = -1.112372
    ids, scores = fuse(DENSE_IDS, DENSE, SPARSE_IDS, SPARSE, k=4, method="zscore", sparse_weight=0.5)
    assert ids.tolist() == [[1, 3, 2, 4]]
    np.testing.assert_allclose(scores, [[0.112372, -0.112372, -0.5, -1.112372]], atol=1e-6)


def test_rows_are_independent_and_an_empty_side_is_harmless():
    dense_ids = np.array([[1, 2, 3], [7, 8, -1]])
    dense = np.array([[0.9, 0.7, 0.5], [0.4, 0.2, -np.inf]])
    sparse_ids = np.array([[3, 4, -1], [-1, -1, -1]])
    sparse = np.array([[10.0, 6.0, -np.inf], [-np.inf] * 3])
    ids, scores = fuse(dense_ids, dense, sparse_ids, sparse, k=3, method="minmax", sparse_weight=0.5)
    assert ids[0].tolist() == [1, 3, 2]
    # row 2: only dense; .5·(1, 0) -> 7 .5, 8 0 ; nothing else, so the third slot is empty
    assert ids[1].tolist() == [7, 8, -1]
    np.testing.assert_allclose(scores[1][:2], [0.5, 0.0])


def test_merge_sums_shared_ids_once():
    ids, fused = merge_by_id(
        np.array([[4, 2]]),
        np.array([[1.0, 2.0]]),
        np.zeros((1, 1)),
        np.array([[2, 9]]),
        np.array([[10.0, 20.0]]),
        np.zeros((1, 1)),
    )
    got = {i: f for i, f in zip(ids[0].tolist(), fused[0].tolist(), strict=True) if i >= 0}
    assert got == {2: 12.0, 4: 1.0, 9: 20.0}


def test_top_k_orders_by_score_then_id():
    ids, scores = top_k(np.array([[5, 3, 8, -1]]), np.array([[1.0, 2.0, 2.0, -np.inf]]), 3)
    assert ids.tolist() == [[3, 8, 5]] and scores.tolist() == [[2.0, 2.0, 1.0]]


def test_unknown_method_is_an_error():
    with pytest.raises(ValueError, match="unknown fusion"):
        fuse(DENSE_IDS, DENSE, SPARSE_IDS, SPARSE, k=3, method="max")
