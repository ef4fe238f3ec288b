"""Fair scheduling on a real server (127.0.0.1): a 2,000-query request in flight delays a concurrent 1-query
request by at most the chunk already running (the small one is answered with the next chunk), and a request
whose client disconnects stops costing work (its chunks not yet started are dropped).

Times are compared with the chunk times the server itself measured during the same run, not with
wall-clock constants, so a loaded machine slows both sides alike.
"""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from services.retriever.app import build_app
from services.retriever.config import RetrieverSettings
from shared.redis_server import free_port
from tests.integration.retriever.conftest import TEST_LIMITS, ServerThread

CHUNK = 16
BIG = [f"who directed the film number {i} about a river town" for i in range(2000)]


@pytest.fixture(scope="module")
def chunked(index_dir):
    # One worker: the small request cannot slip past the big one on a second worker, so this is the hard case.
    settings = RetrieverSettings.load(index_dir=str(index_dir), cpu_threads=1, chunk_queries=CHUNK, **TEST_LIMITS)
    with ServerThread(build_app(settings), free_port()) as running:
        yield running


def _dropped(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return float(re.search(r"^coda_retriever_dropped_queries_total (\S+)$", text, re.MULTILINE).group(1))


async def _until(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


async def test_a_small_request_is_not_held_up_by_a_big_one_and_a_gone_client_is_dropped(chunked):
    batcher = chunked.app.state.batcher
    chunk_times = batcher.chunk_seconds
    url = chunked.url
    async with httpx.AsyncClient(timeout=120) as small_client:
        big_client = httpx.AsyncClient(timeout=120)
        big = asyncio.create_task(big_client.post(url + "/retrieve", json={"queries": BIG, "mode": "dense"}))
        try:
            start_count = len(chunk_times)
            await _until(lambda: len(chunk_times) >= start_count + 2, 60)  # the big request is under way
            latencies = []
            for i in range(3):
                t = time.perf_counter()
                r = await small_client.post(url + "/retrieve", json={"queries": [f"Ed Wood film {i}"], "mode": "dense"})
                latencies.append(time.perf_counter() - t)
                assert r.status_code == 200 and len(r.json()["result"][0]) == 3
            assert not big.done()  # it really was in flight the whole time
            one_chunk = max(list(chunk_times)[start_count:])
            # Waiting for the running chunk, then its own chunk (which the big request fills up): ≤ 2 chunks,
            # where the big request alone is 2000 / 16 = 125 chunks.
            for latency in latencies:
                assert latency <= 2 * one_chunk + 0.25, (latencies, one_chunk)
        finally:
            # The big request's client goes away mid-request.
            big.cancel()
            await asyncio.gather(big, return_exceptions=True)
            await big_client.aclose()

        # Its queued chunks are dropped: the counter says so and the worker goes idle.
        await asyncio.to_thread(lambda: asyncio.run(_wait_dropped(url)))
        settled = len(chunk_times)
        await asyncio.sleep(max(4 * one_chunk, 0.5))
        computed_after = len(chunk_times) - settled
        assert computed_after <= 1, "chunks of the abandoned request were still computed"
        assert batcher.queued == 0
        dropped = _dropped(url)
        assert 0 < dropped < len(BIG)
        r = await small_client.post(url + "/retrieve", json={"queries": ["Ed Wood"], "mode": "dense"})
        assert r.status_code == 200


async def _wait_dropped(url: str) -> None:
    await _until(lambda: _dropped(url) > 0, 30)
