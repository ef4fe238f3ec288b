"""The one client every service uses to call the retriever's ``POST /retrieve``.

    async with AsyncRetrieverClient("http://127.0.0.1:8000") as retriever:
        docs = await retriever.retrieve(["who wrote hamlet"], topk=3)
        docs[0][0].title, docs[0][0].text, docs[0][0].score

Pooled connections (one ``httpx`` client per instance), bounded retries of transient failures (429, 502,
503, 504, refused connections) through ``shared.retry``, never of a 500 or another 4xx. Large query lists are split into requests of
at most ``max_queries_per_request`` sent concurrently, so a caller never hits the server's per-request cap.
``RetrieverClient`` is the synchronous twin for CLIs and data builders. ``BatchingRetriever`` wraps the async
client for the rollout, whose concurrent episodes' queries it sends as one request per short window.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
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


class BatchingRetriever:
    """Wraps an ``AsyncRetrieverClient`` (or anything with its async ``retrieve``): coalesces the retrieval calls of concurrent episodes into one ``/retrieve`` request per short window.

    Hundreds of episodes in flight each search one query at a time; sending them one HTTP request each costs
    the rollout process a full HTTP round of CPU per query. ``BatchingRetriever`` collects the queries that
    arrive within ``window_s`` (or until ``max_queries``), sends them as one list (the retriever batches them
    into one encode and one search anyway) and hands every caller its own slice. A failed request fails every
    caller of that batch with the same error (the inner client has already retried it).
    """

    def __init__(self, inner: AsyncRetrieverClient, *, window_s: float = 0.002, max_queries: int = 256) -> None:
        self.inner, self.window_s, self.max_queries = inner, window_s, max_queries
        self._pending: list[tuple[list[str], int | None, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None
        self._inflight: set[asyncio.Task] = set()  # referenced so the loop cannot drop them mid-request

    async def retrieve(self, queries: list[str], topk: int | None = None) -> list[list[RetrievedDocument]]:
        if not queries:
            return []
        future = asyncio.get_running_loop().create_future()
        self._pending.append((list(queries), topk, future))
        if sum(len(q) for q, _, _ in self._pending) >= self.max_queries:
            self._flush_now()
        elif self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_later())
        return await future

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.window_s)
        self._flusher = None
        self._flush_now()

    def _flush_now(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            self._flusher = None
        batch, self._pending = self._pending, []
        by_topk: dict[int | None, list] = defaultdict(list)
        for item in batch:
            by_topk[item[1]].append(item)
        for topk, items in by_topk.items():
            task = asyncio.create_task(self._send(topk, items))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _send(self, topk: int | None, items: list) -> None:
        try:
            results = await self.inner.retrieve([q for queries, _, _ in items for q in queries], topk=topk)
        except Exception as exc:  # every waiting episode gets the failure, none hangs
            for _, _, future in items:
                if not future.done():
                    future.set_exception(exc)
            return
        start = 0
        for queries, _, future in items:
            if not future.done():
                future.set_result(results[start : start + len(queries)])
            start += len(queries)

    async def aclose(self) -> None:
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()


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
