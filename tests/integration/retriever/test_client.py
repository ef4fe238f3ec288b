"""``shared.retriever_client`` against the real server: parsing, chunking, options, no retries on 4xx."""

from __future__ import annotations

import time

import httpx
import pytest

from shared.protocol.retrieval import RetrievedDocument
from shared.retriever_client import AsyncRetrieverClient, RetrieverClient
from shared.retry import RetryPolicy

QUERIES = ["Ed Wood", "Scott Derrickson", "Arthur's Magazine", "First for Women", "Ed Wood"]


async def test_async_client_chunks_and_keeps_order(server):
    async with AsyncRetrieverClient(server.url, max_queries_per_request=2) as client:
        docs = await client.retrieve(QUERIES, topk=2)
        assert len(docs) == 5 and all(len(d) == 2 for d in docs)
        assert isinstance(docs[0][0], RetrievedDocument)
        # The repeated query lands in another chunk, so it is encoded in another pass: same documents, and the
        # scores equal up to what the pass changes (batch composition; fp32 ONNX for a pass of 1-2 queries,
        # bf16 torch for a larger one where the CPU has native bf16: ~1e-4).
        assert [d.id for d in docs[0]] == [d.id for d in docs[4]]
        assert [d.score for d in docs[0]] == pytest.approx([d.score for d in docs[4]], abs=1e-3)
        assert docs[0][0].title.startswith('"') and docs[0][0].text and docs[0][0].score >= docs[0][1].score
        assert "Scott Derrickson" in docs[1][0].contents
        assert await client.retrieve([]) == []
        sparse = await client.retrieve(["Ed Wood"], topk=4, mode="sparse", fusion="rrf")
        assert len(sparse[0]) == 4


def test_sync_client_accepts_the_search_r1_url(server):
    with RetrieverClient(server.url + "/retrieve") as client:
        docs = client.retrieve(["Ed Wood"])
        assert len(docs) == 1 and len(docs[0]) == 3  # server default topk
        with pytest.raises(TypeError):
            client.retrieve("Ed Wood")


async def test_4xx_is_not_retried(server):
    async with AsyncRetrieverClient(server.url, policy=RetryPolicy(attempts=4, backoff_s=1.0)) as client:
        start = time.perf_counter()
        with pytest.raises(httpx.HTTPStatusError) as info:
            await client.retrieve(["Ed Wood"], topk=100_000)
        assert info.value.response.status_code == 400 and time.perf_counter() - start < 1.0
