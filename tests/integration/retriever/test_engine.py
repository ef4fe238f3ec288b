"""The engine behind the server: start-up state, batched searches over modes, the encoder's prefixes."""

from __future__ import annotations

import httpx
import pytest

from services.retriever.app import build_app
from services.retriever.config import RetrieverSettings
from services.retriever.encoder import Encoder
from services.retriever.engine import SearchSpec
from shared.redis_server import free_port
from tests.integration.retriever.conftest import TEST_SETTINGS, ServerThread


def test_sparse_default_server_warms_the_encoder_before_it_is_ready(index_dir):
    # A sparse-default server (the CPU embedded default) still answers mode=dense; loading the model on that
    # first request stalled every query for ~8 s. It is loaded and warmed before /health says ready.
    app = build_app(RetrieverSettings.load(index_dir=str(index_dir), mode="sparse", **TEST_SETTINGS))
    with ServerThread(app, free_port()) as server:
        assert httpx.get(server.url + "/health").status_code == 200
        retriever = app.state.retriever
        encoder = retriever.encoder
        assert isinstance(encoder, Encoder) and encoder.warm_s is not None  # before any request
        dense = httpx.post(server.url + "/retrieve", json={"queries": ["Scott Derrickson"], "mode": "dense"})
        assert dense.status_code == 200 and len(dense.json()["result"][0]) == 3
        assert retriever.encoder is encoder  # the first dense query used the warm encoder
        ids, scores = retriever.search(["Scott Derrickson", "Ed Wood", "Scott Derrickson"], 3, "sparse")
        assert ids.shape == (3, 3) and ids[0].tolist() == ids[2].tolist()  # duplicates searched once
        assert scores[0, 0] >= scores[0, 1] >= scores[0, 2] > 0
        assert "Scott Derrickson" in retriever.corpus.contents(int(ids[0, 0]))


def test_search_many_mixes_modes_and_depths(server):
    retriever = server.app.state.retriever
    specs = [
        SearchSpec(["Ed Wood"], 2, "dense"),
        SearchSpec(["Ed Wood", "Scott Derrickson"], 5, "hybrid", depth=10),
        SearchSpec(["Ed Wood"], 4, "sparse"),
    ]
    (d_ids, _), (h_ids, h_scores), (s_ids, _) = retriever.search_many(specs)
    assert d_ids.shape == (1, 2) and h_ids.shape == (2, 5) and s_ids.shape == (1, 4)
    alone_dense, _ = retriever.search(["Ed Wood"], 2, "dense")
    assert d_ids.tolist() == alone_dense.tolist()  # batching with others changes nothing
    assert (h_scores[:, :-1] >= h_scores[:, 1:]).all()


def test_query_prefix_is_prepended(server):
    if server.app.state.settings.dense_backend != "faiss":
        pytest.skip("the encoder is the same for every backend; checked once")
    encoder = server.app.state.retriever.encoder
    try:
        encoder.query_prefix = "query: "
        prefixed = encoder.encode_queries(["who directed Ed Wood"])
    finally:
        encoder.query_prefix = ""
    explicit = encoder.encode_queries(["query: who directed Ed Wood"])
    plain = encoder.encode_queries(["who directed Ed Wood"])
    assert abs(float(prefixed[0] @ explicit[0]) - 1.0) < 1e-5 and float(prefixed[0] @ plain[0]) < 0.999
