"""The retrieval batcher: concurrent calls share one request, each caller gets its own slice, failures
reach every caller."""

from __future__ import annotations

import asyncio

import pytest

from shared.retriever_client import BatchingRetriever
from tests.unit.agents.helpers import FakeRetriever


class Counting(FakeRetriever):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []

    async def retrieve(self, queries, topk=None):
        self.calls.append(list(queries))
        return await super().retrieve(queries, topk)


async def test_concurrent_queries_share_one_request():
    inner = Counting()
    batcher = BatchingRetriever(inner, window_s=0.01)
    results = await asyncio.gather(
        *(batcher.retrieve([f"q{i}"], topk=2) for i in range(5)), batcher.retrieve(["a", "b"], topk=2)
    )
    assert inner.calls == [["q0", "q1", "q2", "q3", "q4", "a", "b"]]
    assert [r[0][0].contents for r in results[:5]] == [f'"Title q{i} 0"\nText about q{i}.' for i in range(5)]
    assert [docs[0].contents.split()[1] for docs in results[5]] == ["a", "b"] and len(results[5][0]) == 2


async def test_different_topk_are_separate_requests_and_full_batches_flush_early():
    inner = Counting()
    batcher = BatchingRetriever(inner, window_s=10.0, max_queries=3)
    out = await asyncio.wait_for(asyncio.gather(*(batcher.retrieve([f"q{i}"], topk=1) for i in range(3))), 1)
    assert len(out) == 3 and inner.calls == [["q0", "q1", "q2"]]  # did not wait the 10 s window
    batcher.window_s = 0.01
    await asyncio.gather(batcher.retrieve(["x"], topk=1), batcher.retrieve(["y"], topk=3))
    assert sorted(inner.calls[1:]) == [["x"], ["y"]]


async def test_a_failure_reaches_every_caller():
    class Down:
        async def retrieve(self, queries, topk=None):
            raise ConnectionError("retriever down")

    batcher = BatchingRetriever(Down(), window_s=0.005)
    results = await asyncio.gather(*(batcher.retrieve(["q"]) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    with pytest.raises(ConnectionError):
        await batcher.retrieve(["again"])
