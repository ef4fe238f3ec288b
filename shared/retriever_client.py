"""The one client every service uses to call the retriever's ``POST /retrieve``.

    async with AsyncRetrieverClient("http://127.0.0.1:8000") as retriever:
        docs = await retriever.retrieve(["who wrote hamlet"], topk=3)
        docs[0][0].title, docs[0][0].text, docs[0][0].score

Pooled connections (one ``httpx`` client per instance), bounded retries of transient failures (429, 502,
503, 504, refused connections) through ``shared.retry``, never of a 500 or another 4xx. Large query lists are split into requests of
at most ``max_queries_per_request`` sent concurrently, so a caller never hits the server's per-request cap.
``RetrieverClient`` is the synchronous twin for CLIs and data builders.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from shared.protocol.retrieval import FusionMethod, RetrievalMode, RetrievedDocument
from shared.retry import RetryPolicy, arequest, request

DEFAULT_URL = "http://127.0.0.1:8000"


def _endpoint(base_url: str) -> str:
    """Accept either the server root or the full ``…/retrieve`` URL (Search-R1 configs use the latter)."""
    base = base_url.rstrip("/")
    return base if base.endswith("/retrieve") else base + "/retrieve"


def _payload(
    queries: list[str],
    topk: int | None,
    mode: RetrievalMode | None,
    fusion: FusionMethod | None,
    sparse_weight: float | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"queries": list(queries), "topk": topk, "return_scores": True}
    for key, value in (("mode", mode), ("fusion", fusion), ("sparse_weight", sparse_weight)):
        if value is not None:
            body[key] = value
    return body


def _parse(body: dict[str, Any], expected: int) -> list[list[RetrievedDocument]]:
    result = body.get("result")
    if not isinstance(result, list) or len(result) != expected:
        got = len(result) if isinstance(result, list) else type(result).__name__
        raise ValueError(f"retriever answered {got} result lists for {expected} queries")
    return [
        [RetrievedDocument.model_validate({**item["document"], "score": item["score"]}) for item in docs]
        for docs in result
    ]


def _chunks(queries: list[str], size: int) -> list[list[str]]:
    if isinstance(queries, str):
        raise TypeError("queries must be a list of strings, not one string")
    queries = list(queries)
    return [queries[i : i + size] for i in range(0, len(queries), size)] or [[]]


class AsyncRetrieverClient:
    """Async client: ``await retrieve(queries, topk) -> list[list[RetrievedDocument]]``, aligned with queries."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        timeout_s: float = 30.0,
        policy: RetryPolicy = RetryPolicy(),
        max_connections: int = 64,
        max_queries_per_request: int = 1024,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = _endpoint(base_url)
        self.policy = policy
        self.max_queries_per_request = max_queries_per_request
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def retrieve(
        self,
        queries: list[str],
        topk: int | None = None,
        mode: RetrievalMode | None = None,
        *,
        fusion: FusionMethod | None = None,
        sparse_weight: float | None = None,
    ) -> list[list[RetrievedDocument]]:
        """Top-``topk`` documents per query (server default 3 when None), best first."""
        if not queries:
            return []
        chunks = _chunks(queries, self.max_queries_per_request)
        parts = await asyncio.gather(*(self._one(c, topk, mode, fusion, sparse_weight) for c in chunks))
        return [docs for part in parts for docs in part]

    async def _one(self, queries, topk, mode, fusion, sparse_weight) -> list[list[RetrievedDocument]]:
        body = _payload(queries, topk, mode, fusion, sparse_weight)
        response = await arequest(self._client, "POST", self.url, json=body, policy=self.policy)
        return _parse(response.json(), len(queries))

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> AsyncRetrieverClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


class RetrieverClient:
    """Synchronous twin of ``AsyncRetrieverClient`` (chunks are sent one after another)."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        timeout_s: float = 30.0,
        policy: RetryPolicy = RetryPolicy(),
        max_queries_per_request: int = 1024,
        client: httpx.Client | None = None,
    ) -> None:
        self.url = _endpoint(base_url)
        self.policy = policy
        self.max_queries_per_request = max_queries_per_request
        self._owns_client = client is None
        self._client = client or httpx.Client(timeout=timeout_s)

    def retrieve(
        self,
        queries: list[str],
        topk: int | None = None,
        mode: RetrievalMode | None = None,
        *,
        fusion: FusionMethod | None = None,
        sparse_weight: float | None = None,
    ) -> list[list[RetrievedDocument]]:
        """Top-``topk`` documents per query (server default 3 when None), best first."""
        if not queries:
            return []
        out: list[list[RetrievedDocument]] = []
        for chunk in _chunks(queries, self.max_queries_per_request):
            body = _payload(chunk, topk, mode, fusion, sparse_weight)
            response = request(self._client, "POST", self.url, json=body, policy=self.policy)
            out += _parse(response.json(), len(chunk))
        return out

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> RetrieverClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
