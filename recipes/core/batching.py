"""Coalesces the retrieval calls of concurrent episodes into one ``/retrieve`` request per short window.

Hundreds of episodes in flight each search one query at a time; sending them one HTTP request each costs
the rollout process a full HTTP round of CPU per query. ``BatchingRetriever`` collects the queries that
arrive within ``window_s`` (or until ``max_queries``), sends them as one list (the retriever batches them
into one encode and one search anyway) and hands every caller its own slice. A failed request fails every
caller of that batch with the same error (the inner client has already retried it).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from recipes.core.context import Retriever
from shared.protocol.retrieval import RetrievedDocument


class BatchingRetriever:
    def __init__(self, inner: Retriever, *, window_s: float = 0.002, max_queries: int = 256) -> None:
        self.inner, self.window_s, self.max_queries = inner, window_s, max_queries
        self._pending: list[tuple[list[str], int | None, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None
        self.requests = 0  # batches sent (for tests and metrics)
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
        self.requests += 1
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
