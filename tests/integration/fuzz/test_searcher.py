"""Fuzz every route of the searcher (the scripted LLM, the real retriever) from its OpenAPI schema."""

from __future__ import annotations

import httpx
from hypothesis import strategies as st

from shared.protocol.search import SearchResponse
from tests.integration.fuzz.openapi import Target, fuzz_service, mostly, summary

HINTS = {
    "POST /search": {
        "query": mostly(
            st.sampled_from(["Where does Velkadar live?", "Who keeps an owl?"]) | st.text(min_size=1, max_size=30),
            st.sampled_from(["", " ", "\t\n", "x" * 5000]),
        ),
        "max_turns": mostly(st.integers(1, 3) | st.none(), st.sampled_from([0, 9, 33, -1, 2**63])),
    }
}


def answer(url: str) -> SearchResponse:
    reply = httpx.post(url + "/search", json={"query": "Where does Velkadar live?"}, timeout=30)
    assert reply.status_code == 200, reply.text
    return SearchResponse.model_validate(reply.json())


def test_every_searcher_route_survives_fuzzing(fuzz_searcher, monkeypatch):
    url, app = fuzz_searcher
    results = fuzz_service(Target(url, app, HINTS), monkeypatch)
    print(summary(results))
    assert set(results) == {"POST /search [any]", "GET /health [any]", "GET /metrics [any]"}
    result = answer(url)  # the scripted model answers with the first document's title
    assert result.success and result.num_searches == 1 and result.summary == "Velkadar"
    assert httpx.get(url + "/health", timeout=10).status_code == 200
