"""Corpus normalisation and storage, request resolution (defaults and limits) and response rendering."""

from __future__ import annotations

import json

import numpy as np
import pytest

from services.retriever.app import render, resolve
from services.retriever.config import RetrieverSettings
from services.retriever.corpus import CorpusStore, normalize_row, write_corpus
from shared.http import ApiError
from shared.protocol.retrieval import RetrieveRequest, RetrieveResponse, split_contents


def test_normalize_row_keeps_extras_and_fills_id_and_contents():
    assert normalize_row({"contents": '"T"\nbody', "src": "x"}, 7) == {"id": "7", "contents": '"T"\nbody', "src": "x"}
    assert normalize_row({"id": 12, "title": "T", "text": "body"}, 0)["contents"] == '"T"\nbody'
    assert normalize_row({"id": "a", "text": "only text"}, 0)["contents"] == "only text"
    with pytest.raises(ValueError, match="row 3"):
        normalize_row({"id": "x"}, 3)
    with pytest.raises(ValueError, match="must be a string"):
        normalize_row({"contents": 5}, 0)


@pytest.fixture
def store(tmp_path):
    rows = [{"id": "0", "contents": '"A"\nalpha'}, {"contents": '"B"\nbéta "quoted"', "extra": [1, 2]}]
    assert list(write_corpus(iter(rows), tmp_path)) == ['"A"\nalpha', '"B"\nbéta "quoted"']
    corpus = CorpusStore(tmp_path)
    yield corpus
    corpus.close()


def test_corpus_store_reads_rows_by_position(store):
    assert len(store) == 2
    assert store.row(1) == {"id": "1", "contents": '"B"\nbéta "quoted"', "extra": [1, 2]}
    assert json.loads(store.raw(0)) == {"id": "0", "contents": '"A"\nalpha'}


def test_render_splices_rows_and_drops_empty_slots(store):
    ids, scores = np.array([[1, 0, -1], [-1, -1, -1]]), np.array([[0.5, 0.25, -np.inf], [-np.inf] * 3])
    body = json.loads(render(store, ids, scores, return_scores=True))
    assert body == {
        "result": [[{"document": store.row(1), "score": 0.5}, {"document": store.row(0), "score": 0.25}], []]
    }
    RetrieveResponse.model_validate(body)
    plain = json.loads(render(store, ids, scores, return_scores=False))
    assert plain == {"result": [[store.row(1), store.row(0)], []]}
    RetrieveResponse.model_validate(plain)


def test_resolve_fills_defaults_like_search_r1():
    settings = RetrieverSettings(max_topk=50, max_queries=4)
    for topk in (None, 0):
        spec = resolve(RetrieveRequest(queries=["q"], topk=topk), settings)
        assert spec.k == 3 and spec.mode == "hybrid" and spec.fusion == "minmax" and spec.depth == 100
    spec = resolve(RetrieveRequest(queries=["q"], topk=7, mode="sparse", sparse_weight=0.0, rrf_k=5), settings)
    assert (spec.k, spec.mode, spec.sparse_weight, spec.rrf_k) == (7, "sparse", 0.0, 5)
    assert spec.side_k() == 7 and resolve(RetrieveRequest(queries=["q"], topk=150 // 3), settings).side_k() == 100


def test_resolve_enforces_the_limits():
    settings = RetrieverSettings(max_topk=50, max_queries=4, max_depth=200)
    with pytest.raises(ApiError, match="limit of 50"):
        resolve(RetrieveRequest(queries=["q"], topk=51), settings)
    with pytest.raises(ApiError, match="at most 4"):
        resolve(RetrieveRequest(queries=["q"] * 5), settings)
    with pytest.raises(ApiError, match="depth 201"):
        resolve(RetrieveRequest(queries=["q"], depth=201), settings)


def test_resolve_refuses_dense_and_hybrid_on_a_sparse_only_server():
    settings = RetrieverSettings(mode="sparse")
    assert resolve(RetrieveRequest(queries=["q"]), settings).mode == "sparse"  # no mode: the server's
    assert resolve(RetrieveRequest(queries=["q"], mode="sparse"), settings).mode == "sparse"
    for mode in ("dense", "hybrid"):
        with pytest.raises(ApiError, match=f"started sparse-only .* cannot answer mode={mode}") as refused:
            resolve(RetrieveRequest(queries=["q"], mode=mode), settings)
        assert (refused.value.status_code, refused.value.param) == (400, "mode")
    assert resolve(RetrieveRequest(queries=["q"], mode="sparse"), RetrieverSettings(mode="dense")).mode == "sparse"


def test_split_contents_keeps_the_quotes_like_search_r1():
    assert split_contents('"Evan Morris"\nEvan L. Morris\nmore') == ('"Evan Morris"', "Evan L. Morris\nmore")
    assert split_contents("no title line") == ("no title line", "")
