"""The engine behind the server: batched searches over modes, the encoder's prefixes (start-up: test_startup)."""

from __future__ import annotations

import pytest

from services.retriever.engine import SearchSpec


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
