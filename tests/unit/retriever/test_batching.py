"""MicroBatcher: concurrent submissions share calls, each gets its own result, failures reach every caller."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from services.retriever.batching import BatcherStopped, MicroBatcher
from services.retriever.engine import SearchSpec


def echo_run(calls: list, threads: set):
    def run(specs):
        calls.append([len(s.queries) for s in specs])
        threads.add(threading.get_ident())
        # each result encodes its request: ids = the query strings' lengths
        return [(np.array([[len(q)] for q in s.queries]), np.zeros((len(s.queries), 1))) for s in specs]
    return run


async def test_concurrent_requests_share_batches_and_get_their_own_results():
    calls, threads = [], set()
    batcher = MicroBatcher(echo_run(calls, threads), window_s=0.01, max_queries=1000)
    await batcher.start()
    try:
        specs = [SearchSpec(["x" * (i + 1)] * (i % 3 + 1), k=1) for i in range(20)]
        results = await asyncio.gather(*(batcher.submit(s) for s in specs))
    finally:
        await batcher.stop()
    for i, (ids, _) in enumerate(results):
        assert ids.ravel().tolist() == [i + 1] * (i % 3 + 1)
    assert sum(len(c) for c in calls) == 20 and len(calls) < 20
    assert len(threads) == 1  # one owner thread for the index


async def test_max_queries_closes_a_batch():
    calls, threads = [], set()
    batcher = MicroBatcher(echo_run(calls, threads), window_s=0.05, max_queries=4)
    await batcher.start()
    try:
        await asyncio.gather(*(batcher.submit(SearchSpec(["q", "q"], k=1)) for _ in range(6)))
    finally:
        await batcher.stop()
    assert all(sum(c) <= 4 for c in calls) and sum(map(sum, calls)) == 12


async def test_a_failing_batch_fails_its_callers_and_the_batcher_survives():
    state = {"fail": True}

    def run(specs):
        if state["fail"]:
            raise RuntimeError("index exploded")
        return [(np.zeros((1, 1)), np.zeros((1, 1))) for _ in specs]

    batcher = MicroBatcher(run, window_s=0.0)
    await batcher.start()
    try:
        with pytest.raises(RuntimeError, match="exploded"):
            await batcher.submit(SearchSpec(["q"], k=1))
        state["fail"] = False
        ids, _ = await batcher.submit(SearchSpec(["q"], k=1))
        assert ids.shape == (1, 1)
    finally:
        await batcher.stop()


async def test_submit_before_start_is_an_error():
    with pytest.raises(BatcherStopped, match="not running"):
        await MicroBatcher(lambda specs: []).submit(SearchSpec(["q"], k=1))


async def test_stop_fails_queued_and_running_requests_instead_of_hanging():
    release = threading.Event()

    def slow(specs):
        release.wait(5)
        return [(np.zeros((1, 1)), np.zeros((1, 1))) for _ in specs]

    batcher = MicroBatcher(slow, window_s=0.0, max_queries=1)
    await batcher.start()
    running = asyncio.create_task(batcher.submit(SearchSpec(["a"], k=1)))
    await asyncio.sleep(0.05)  # the first request is inside the slow batch now
    queued = asyncio.create_task(batcher.submit(SearchSpec(["b"], k=1)))
    await asyncio.sleep(0.01)
    stopping = asyncio.create_task(batcher.stop())
    await asyncio.sleep(0.05)
    release.set()
    await stopping
    for task in (running, queued):
        with pytest.raises(BatcherStopped):
            await asyncio.wait_for(task, 5)
