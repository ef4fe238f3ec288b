"""Micro-batching: concurrent requests are merged into one ``search_many`` call on the index-owner thread.

Requests wait in an asyncio queue. The batcher takes whatever is queued (waiting up to ``window_s`` for
more, and stopping once ``max_queries`` are gathered), hands the lot to one worker thread, and resolves
each request's future with its own slice. While a batch runs, new requests pile up and form the next
batch, so under load batches grow by themselves and the encoder and indexes see large, efficient calls.
A single thread owns the index: FAISS GPU indexes are not thread-safe, and one owner never oversubscribes
the cores.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from services.retriever.engine import Result, SearchSpec
from shared.log import get_logger

log = get_logger(__name__)

BatchObserver = Callable[[int, int], None]  # (requests in the batch, queries in the batch)


class BatcherStopped(RuntimeError):
    """The batcher is not running (not started yet, or shutting down): the route answers 503."""


class MicroBatcher:
    """``await submit(spec)`` → that spec's ``(ids, scores)``, computed together with its neighbours."""

    def __init__(self, run: Callable[[list[SearchSpec]], list[Result]], *, window_s: float = 0.002,
                 max_queries: int = 4096, on_batch: BatchObserver | None = None) -> None:
        self.run, self.window_s, self.max_queries = run, window_s, max_queries
        self.on_batch = on_batch or (lambda requests, queries: None)
        self._queue: asyncio.Queue[tuple[SearchSpec, asyncio.Future]] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retriever-index")
        self._task: asyncio.Task | None = None

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="retriever-batcher")

    async def stop(self) -> None:
        """Stop taking batches; requests still queued or mid-batch fail with ``BatcherStopped``, never hang."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        while not self._queue.empty():
            _, future = self._queue.get_nowait()
            if not future.done():
                future.set_exception(BatcherStopped("the retriever is shutting down"))
        # Wait (off the event loop) for a batch still running in the thread, so the index is not closed under it.
        try:
            await asyncio.to_thread(self._executor.shutdown, wait=True)
        except RuntimeError:
            # The interpreter is exiting (its default executor takes no new work): wait here instead.
            self._executor.shutdown(wait=True)

    async def submit(self, spec: SearchSpec) -> Result:
        if self._task is None or self._task.done():
            raise BatcherStopped("the retriever is not running")
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((spec, future))
        return await future

    async def _gather(self) -> list[tuple[SearchSpec, asyncio.Future]]:
        loop = asyncio.get_running_loop()
        batch = [await self._queue.get()]
        queries = len(batch[0][0].queries)
        deadline = loop.time() + self.window_s
        while queries < self.max_queries:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            batch.append(item)
            queries += len(item[0].queries)
        return batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather()
            live = [(spec, fut) for spec, fut in batch if not fut.done()]  # drop requests whose client left
            if not live:
                continue
            self.on_batch(len(live), sum(len(spec.queries) for spec, _ in live))
            try:
                results = await loop.run_in_executor(self._executor, self.run, [spec for spec, _ in live])
            except asyncio.CancelledError:
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(BatcherStopped("the retriever is shutting down"))
                raise
            except Exception as exc:  # the route turns it into an error answer; the batcher keeps going
                log.exception("batch failed", extra={"requests": len(live)})
                for _, fut in live:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut), result in zip(live, results, strict=True):
                if not fut.done():
                    fut.set_result(result)
