"""Operator surface: /health, /metrics (requests, latency, batch sizes), OpenAPI docs; micro-batching under
concurrency (120 concurrent single-query requests, like verl's SearchTool pool, and no 5xx)."""

from __future__ import annotations

import asyncio
import re

import httpx


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def test_health_openapi_and_docs(server):
    r = httpx.get(server.url + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok" and "6785 documents" in r.json()["checks"]["index"]
    spec = httpx.get(server.url + "/openapi.json").json()
    assert "/retrieve" in spec["paths"] and "RetrieveRequest" in str(spec)
    assert httpx.get(server.url + "/docs").status_code == 200


async def test_concurrent_requests_are_micro_batched_without_errors(server):
    before = httpx.get(server.url + "/metrics").text
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=120)) as client:
        responses = await asyncio.gather(
            *(
                client.post(
                    server.url + "/retrieve",
                    json={"queries": [f"Ed Wood film {i % 40}"], "topk": 3, "return_scores": True},
                )
                for i in range(120)
            )
        )
    assert [r.status_code for r in responses] == [200] * 120
    assert all(len(r.json()["result"][0]) == 3 for r in responses)
    after = httpx.get(server.url + "/metrics").text
    batches = _metric(after, "coda_retriever_batch_requests_count") - _metric(
        before, "coda_retriever_batch_requests_count"
    )
    requests = _metric(after, "coda_retriever_batch_requests_sum") - _metric(
        before, "coda_retriever_batch_requests_sum"
    )
    assert requests == 120 and batches < 120  # several requests shared an encode and a search
    assert 'coda_retriever_stage_seconds_count{stage="encode"}' in after
    assert 'coda_http_requests_total{route="/retrieve",service="retriever",status="200"}' in after
    assert "coda_retriever_documents 6785.0" in after
