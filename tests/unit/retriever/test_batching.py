"""MicroBatcher: concurrent submissions share chunks, each gets its own result, big requests are served a chunk
at a time in turn with others, cancelled requests are dropped, failures reach every caller."""

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
    batcher = MicroBatcher(echo_run(calls, threads), window_s=0.01, chunk_queries=1000)
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


async def test_chunk_queries_bounds_a_chunk():
    calls, threads = [], set()
    batcher = MicroBatcher(echo_run(calls, threads), window_s=0.05, chunk_queries=4)
    await batcher.start()
    try:
        await asyncio.gather(*(batcher.submit(SearchSpec([f"a{i}", f"b{i}"], k=1)) for i in range(6)))
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

    batcher = MicroBatcher(slow, window_s=0.0, chunk_queries=1)
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


def recording_run(log: list, delay: float = 0.0):
    """Each query's result is its own text's number ("q17" → 17); ``log`` gets each chunk's specs' queries."""

    def run(specs):
        log.append([list(s.queries) for s in specs])
        if delay:
            threading.Event().wait(delay)
        return [(np.array([[int(q[1:])] for q in s.queries]), np.zeros((len(s.queries), 1))) for s in specs]

    return run


async def test_a_big_request_is_split_into_chunks_and_reassembled_in_order():
    log = []
    batcher = MicroBatcher(recording_run(log), workers=2, chunk_queries=7)
    await batcher.start()
    try:
        ids, scores = await batcher.submit(SearchSpec([f"q{i}" for i in range(100)], k=1))
    finally:
        await batcher.stop()
    assert ids.ravel().tolist() == list(range(100)) and scores.shape == (100, 1)
    assert len(log) == 15 and all(sum(map(len, chunk)) <= 7 for chunk in log)


async def test_a_small_request_waits_for_one_chunk_not_for_a_big_request():
    log = []
    batcher = MicroBatcher(recording_run(log, delay=0.02), workers=1, chunk_queries=10)
    await batcher.start()
    try:
        big = asyncio.create_task(batcher.submit(SearchSpec([f"q{i}" for i in range(1000)], k=1)))
        await asyncio.sleep(0.05)  # the big request is a few chunks in
        chunks_before = len(log)
        ids, _ = await batcher.submit(SearchSpec(["q5000"], k=1))
        chunks_waited = len(log) - chunks_before
        assert ids.ravel().tolist() == [5000]
        assert not big.done()
        # The chunk already running, then the small request's own chunk (which the big one fills up).
        assert chunks_waited <= 2
        assert log[chunks_before + chunks_waited - 1][0] == ["q5000"] or ["q5000"] in log[chunks_before]
        assert (await big)[0].ravel().tolist() == list(range(1000))
    finally:
        await batcher.stop()


async def test_many_requests_share_chunks_round_robin():
    log = []
    batcher = MicroBatcher(recording_run(log), workers=1, chunk_queries=8)
    await batcher.start()
    try:
        specs = [SearchSpec([f"q{r * 100 + i}" for i in range(20)], k=1) for r in range(3)]
        results = await asyncio.gather(*(batcher.submit(s) for s in specs))
    finally:
        await batcher.stop()
    for r, (ids, _) in enumerate(results):
        assert ids.ravel().tolist() == [r * 100 + i for i in range(20)]
    # Turns rotate: after request 0's first chunk comes request 1's, then request 2's.
    firsts = [int(chunk[0][0][1:]) // 100 for chunk in log[:3]]
    assert firsts == [0, 1, 2]


async def test_a_cancelled_request_is_dropped_before_its_remaining_chunks_run():
    log, dropped = [], []
    batcher = MicroBatcher(recording_run(log, delay=0.02), workers=1, chunk_queries=10, on_drop=dropped.append)
    await batcher.start()
    try:
        big = asyncio.create_task(batcher.submit(SearchSpec([f"q{i}" for i in range(1000)], k=1)))
        await asyncio.sleep(0.07)
        big.cancel()
        with pytest.raises(asyncio.CancelledError):
            await big
        ran_at_cancel = len(log)
        ids, _ = await batcher.submit(SearchSpec(["q7"], k=1))  # the worker is free again at once
        assert ids.ravel().tolist() == [7]
    finally:
        await batcher.stop()
    computed = sum(len(q) for chunk in log for q in chunk if q != ["q7"])
    assert computed <= (ran_at_cancel + 1) * 10 and computed < 100
    assert dropped and computed + sum(dropped) == 1000
    assert log[-1] == [["q7"]]


async def test_workers_run_chunks_in_parallel_threads():
    threads, barrier = set(), threading.Barrier(2, timeout=5)

    def run(specs):
        threads.add(threading.get_ident())
        barrier.wait()  # passes only if two chunks are running at the same time
        return [(np.zeros((len(s.queries), 1)), np.zeros((len(s.queries), 1))) for s in specs]

    batcher = MicroBatcher(run, workers=2, chunk_queries=1)
    await batcher.start()
    try:
        await batcher.submit(SearchSpec(["q1", "q2"], k=1))
    finally:
        await batcher.stop()
    assert len(threads) == 2


async def test_duplicates_in_a_request_are_searched_once_and_answered_alike():
    log = []
    batcher = MicroBatcher(recording_run(log), workers=2, chunk_queries=3)
    await batcher.start()
    try:
        ids, _ = await batcher.submit(SearchSpec(["q1", "q2", "q1", "q3", "q2", "q4", "q1"], k=1))
    finally:
        await batcher.stop()
    assert ids.ravel().tolist() == [1, 2, 1, 3, 2, 4, 1]
    assert sorted(q for chunk in log for spec in chunk for q in spec) == ["q1", "q2", "q3", "q4"]


async def test_only_a_chunk_with_the_workers_to_itself_runs_alone():
    log, lone = [], []
    run = recording_run(log, delay=0.02)

    def run_alone(specs):
        lone.append([list(s.queries) for s in specs])
        return run(specs)

    batcher = MicroBatcher(run, workers=2, chunk_queries=4, run_alone=run_alone)
    await batcher.start()
    try:
        await batcher.submit(SearchSpec(["q1"], k=1))  # nothing else in flight
        assert lone == [[["q1"]]]
        # 12 queries in chunks of 4 on 2 workers: the first chunk starts with more waiting, the second while the
        # first runs, so neither runs alone (the last one may, if both workers are idle when it is taken).
        ids, _ = await batcher.submit(SearchSpec([f"q{i}" for i in range(12)], k=1))
        assert ids.ravel().tolist() == list(range(12)) and len(log) == 4
        alone_queries = {q for chunk in lone[1:] for queries in chunk for q in queries}
        assert not alone_queries & {f"q{i}" for i in range(8)}
        assert batcher._running == 0
    finally:
        await batcher.stop()
