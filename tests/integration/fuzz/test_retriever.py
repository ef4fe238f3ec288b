"""Fuzz every route of the retriever (lookup corpus, BM25 + MiniLM FAISS) from its OpenAPI schema."""

from __future__ import annotations

import httpx
from hypothesis import strategies as st

from tests.integration.fuzz.openapi import Target, fuzz_service, mostly, summary

QUERIES = st.lists(
    st.one_of(st.sampled_from(["Where does Velkadar live?", "teacher in Orvale", "owl"]), st.text(max_size=30)),
    max_size=4,
)
HINTS = {
    "POST /retrieve": {
        "queries": mostly(QUERIES, st.lists(st.text(max_size=3), min_size=30, max_size=60)),
        "topk": mostly(st.integers(0, 5) | st.none(), st.sampled_from([-1, 200, 10**6, 2**63])),
        "mode": st.sampled_from([None, "hybrid", "dense", "sparse"]),
        "fusion": st.sampled_from([None, "minmax", "rrf", "zscore"]),
        "sparse_weight": mostly(st.floats(0, 1) | st.none(), st.sampled_from([-0.5, 2.0])),
        "depth": mostly(st.integers(1, 50) | st.none(), st.sampled_from([0, 10**5])),
        "rrf_k": mostly(st.floats(0.1, 100) | st.none(), st.sampled_from([0.0, -1.0, 1e308])),
    }
}


def top_ids(url: str) -> list[str]:
    reply = httpx.post(url + "/retrieve", json={"queries": ["Where does Velkadar live?"], "topk": 3}, timeout=30)
    assert reply.status_code == 200, reply.text
    return [doc["id"] for doc in reply.json()["result"][0]]


def test_every_retriever_route_survives_fuzzing(fuzz_retriever, monkeypatch):
    url, app = fuzz_retriever
    before = top_ids(url)
    results = fuzz_service(Target(url, app, HINTS), monkeypatch)
    print(summary(results))
    assert set(results) == {"POST /retrieve [any]", "GET /health [any]", "GET /metrics [any]"}
    assert top_ids(url) == before and len(before) == 3 and before[0] == "0"  # doc 0 is Velkadar's
    assert httpx.get(url + "/health", timeout=10).status_code == 200
