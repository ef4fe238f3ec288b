"""Fair, chunked scheduling of searches over a few worker threads.

Every request becomes a job. Idle workers take work in chunks of at most ``chunk_queries`` queries. A chunk
first takes requests that have not started yet, oldest first (but at most half the chunk while started
requests are waiting, so these cannot starve), then requests already under way, round-robin: one that
still has queries to go after its share rejoins that queue at the back. So a 2,000-query request is served
a chunk at a time, and a 1-query request that arrives meanwhile waits only for the chunks already running
and is answered with the next one. Many small concurrent requests share one chunk, so the encoder and the
indexes still see batches under load. A job is answered as soon as its last chunk is done.

Workers run their chunks on threads, one per core given (``RetrieverSettings.cpu_threads``), each thread
single-threaded inside torch and FAISS: on a shared CPU, intra-op thread pools that spin-wait for each
other are far slower than independent chunks on independent cores. A chunk that starts while every other
worker is idle and nothing waits runs ``run_alone`` instead, which may use those idle cores. On a GPU there
is one worker (FAISS GPU indexes are not thread-safe).

A job whose caller is cancelled (the route cancels it when the client disconnects) is dropped: its chunks
not yet started are never computed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from services.retriever.engine import Result, SearchSpec, _dedupe
from shared.log import get_logger

log = get_logger(__name__)

BatchObserver = Callable[[int, int], None]  # (requests in the chunk, queries in the chunk)
DropObserver = Callable[[int], None]  # (queries dropped because their caller went away)


class BatcherStopped(RuntimeError):
    """The batcher is not running (not started yet, or shutting down): the route answers 503."""


@dataclass(eq=False)
class _Job:
    spec: SearchSpec  # its distinct queries only
    future: asyncio.Future
    inverse: np.ndarray | None  # request row → distinct query, or None when there were no duplicates
    taken: int = 0  # queries handed to workers so far
    done: int = 0  # queries answered so far
    parts: list[tuple[int, Result]] = field(default_factory=list)  # (first query, result) per finished chunk

    @property
    def size(self) -> int:
        return len(self.spec.queries)

    @property
    def dead(self) -> bool:
        return self.future.done()


class MicroBatcher:
    """``await submit(spec)`` → that spec's ``(ids, scores)``; cancel the awaiting task to drop the work."""

    def __init__(
        self,
        run: Callable[[list[SearchSpec]], list[Result]],
        *,
        workers: int = 1,
        chunk_queries: int = 32,
        window_s: float = 0.0,
        on_batch: BatchObserver | None = None,
        on_drop: DropObserver | None = None,
        thread_init: Callable[[], None] | None = None,
        run_alone: Callable[[list[SearchSpec]], list[Result]] | None = None,
    ) -> None:
        self.run, self.workers, self.chunk_queries, self.window_s = run, max(1, workers), chunk_queries, window_s
        # For a chunk that starts while no other chunk runs and none waits: the other workers' cores are idle,
        # so it may use them (the retriever's encoder then runs one pass on several threads).
        self.run_alone = run_alone or run
        self._running = 0  # chunks being computed now
        self.on_batch = on_batch or (lambda requests, queries: None)
        self.on_drop = on_drop or (lambda queries: None)
        self._fresh: collections.deque[_Job] = collections.deque()  # jobs not started, oldest first
        self._started: collections.deque[_Job] = collections.deque()  # jobs under way, round-robin
        self._jobs: set[_Job] = set()  # every job not answered yet
        self._wake: asyncio.Condition | None = None
        self._executor = ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix="retriever-worker", initializer=thread_init
        )
        self._tasks: list[asyncio.Task] = []
        # Wall seconds of recent chunks (for tests and diagnostics: "one chunk's time" under current load).
        self.chunk_seconds: collections.deque[float] = collections.deque(maxlen=512)

    @property
    def queued(self) -> int:
        """Queries waiting for a worker."""
        return sum(job.size - job.taken for queue in (self._fresh, self._started) for job in queue)

    async def start(self) -> None:
        self._wake = asyncio.Condition()
        self._tasks = [asyncio.create_task(self._worker(), name=f"retriever-worker-{i}") for i in range(self.workers)]

    async def stop(self) -> None:
        """Stop taking chunks; requests still queued or mid-chunk fail with ``BatcherStopped``, never hang."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for job in list(self._jobs):
            if not job.future.done():
                job.future.set_exception(BatcherStopped("the retriever is shutting down"))
        self._jobs.clear()
        self._fresh.clear()
        self._started.clear()
        # Wait (off the event loop) for chunks still running in threads, so the index is not closed under them.
        try:
            await asyncio.to_thread(self._executor.shutdown, wait=True)
        except RuntimeError:
            # The interpreter is exiting (its default executor takes no new work): wait here instead.
            self._executor.shutdown(wait=True)

    async def submit(self, spec: SearchSpec) -> Result:
        if not self._tasks or all(task.done() for task in self._tasks):
            raise BatcherStopped("the retriever is not running")
        # Duplicates within a request are searched once (and so come back identical, whichever chunk ran them).
        unique, inverse = _dedupe(spec.queries)
        job = _Job(
            replace(spec, queries=unique) if len(unique) < len(spec.queries) else spec,
            asyncio.get_running_loop().create_future(),
            inverse if len(unique) < len(spec.queries) else None,
        )
        self._jobs.add(job)
        self._fresh.append(job)
        async with self._wake:
            self._wake.notify()
        try:
            return await job.future
        except asyncio.CancelledError:
            self._drop(job)
            raise

    def _drop(self, job: _Job) -> None:
        """Forget a job whose caller left: chunks not yet started are never computed."""
        if not job.future.done():
            job.future.cancel()
        self._forget(job)
        left = job.size - job.taken
        job.taken = job.size
        if left:
            log.info("request cancelled; dropping its queued queries", extra={"queries": left})
            self.on_drop(left)

    def _forget(self, job: _Job) -> None:
        self._jobs.discard(job)
        for queue in (self._fresh, self._started):
            if job in queue:
                queue.remove(job)

    def _take(self) -> list[tuple[_Job, int, int]]:
        """One chunk: ``(job, first, stop)`` slices (see the module docstring for the order)."""
        pieces: list[tuple[_Job, int, int]] = []
        budget = self.chunk_queries

        def grab(queue: collections.deque[_Job], limit: int) -> int:
            job = queue.popleft()
            if job.dead:
                return 0
            n = min(limit, job.size - job.taken)
            pieces.append((job, job.taken, job.taken + n))
            job.taken += n
            if job.taken < job.size:
                self._started.append(job)  # at the back: the next chunk starts with someone else
            return n

        fresh_cap = max(1, budget // 2) if self._started else budget
        while budget and fresh_cap and self._fresh:
            n = grab(self._fresh, min(budget, fresh_cap))
            budget, fresh_cap = budget - n, fresh_cap - n
        for queue in (self._started, self._fresh):  # then those under way; then fill up with new ones
            while budget and queue:
                budget -= grab(queue, budget)
        return pieces

    async def _next_chunk(self) -> list[tuple[_Job, int, int]]:
        async with self._wake:
            await self._wake.wait_for(lambda: bool(self._fresh or self._started))
            if self.window_s > 0 and self.queued < self.chunk_queries:
                with contextlib.suppress(TimeoutError):  # give concurrent requests a moment to join this chunk
                    await asyncio.wait_for(
                        self._wake.wait_for(lambda: self.queued >= self.chunk_queries), self.window_s
                    )
            pieces = self._take()
            if self._fresh or self._started:
                self._wake.notify()  # more work left: wake another idle worker
            return pieces

    async def _worker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            pieces = await self._next_chunk()
            if not pieces:
                continue
            specs = [replace(job.spec, queries=job.spec.queries[first:stop]) for job, first, stop in pieces]
            self.on_batch(len(pieces), sum(stop - first for _, first, stop in pieces))
            started = time.perf_counter()
            alone = self._running == 0 and not (self._fresh or self._started)
            self._running += 1
            try:
                results = await loop.run_in_executor(self._executor, self.run_alone if alone else self.run, specs)
            except asyncio.CancelledError:
                self._fail(pieces, BatcherStopped("the retriever is shutting down"))
                raise
            except Exception as exc:  # the route turns it into an error answer; the worker keeps going
                log.exception("chunk failed", extra={"requests": len(pieces)})
                self._fail(pieces, exc)
                continue
            finally:
                self._running -= 1
            self.chunk_seconds.append(time.perf_counter() - started)
            for (job, first, stop), result in zip(pieces, results, strict=True):
                if job.dead:
                    continue
                job.parts.append((first, result))
                job.done += stop - first
                if job.done == job.size:
                    self._jobs.discard(job)
                    ids, scores = _assemble(job.parts)
                    if job.inverse is not None:
                        ids, scores = ids[job.inverse], scores[job.inverse]
                    job.future.set_result((ids, scores))

    def _fail(self, pieces: list[tuple[_Job, int, int]], exc: BaseException) -> None:
        for job, _, _ in pieces:
            if not job.dead:
                job.future.set_exception(exc)
            self._forget(job)


def _assemble(parts: list[tuple[int, Result]]) -> Result:
    if len(parts) == 1:
        return parts[0][1]
    parts.sort(key=lambda part: part[0])
    return (np.concatenate([ids for _, (ids, _) in parts]), np.concatenate([scores for _, (_, scores) in parts]))
