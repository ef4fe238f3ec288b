"""The retriever's HTTP app: Search-R1-compatible ``POST /retrieve`` plus ``/health``, ``/metrics``, ``/docs``.

Startup loads the index onto ``app.state`` (the encoder loaded and warmed: ``/health`` is ready only then;
a sparse-only server, ``mode = "sparse"``, loads no encoder and answers dense/hybrid requests 400) and starts
the scheduler (``batching``). The route validates, resolves defaults (topk null/0 → the server
default, exactly like Search-R1), waits for its queries' chunks and writes the JSON itself: corpus rows are
spliced in as stored bytes, which keeps big responses cheap. If the client disconnects first, the route
cancels its job, so its chunks not yet started are never computed.
"""

from __future__ import annotations

import asyncio
import functools
import math
from contextlib import asynccontextmanager

import numpy as np
from fastapi import FastAPI, Request, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.retriever.batching import BatcherStopped, MicroBatcher
from services.retriever.config import RetrieverSettings
from services.retriever.corpus import CorpusStore
from services.retriever.engine import SearchSpec, SparseOnlyError, load_retriever
from shared.http import ApiError, create_app
from shared.log import get_logger
from shared.metrics import LATENCY_BUCKETS
from shared.protocol.retrieval import RetrieveRequest, RetrieveResponse

log = get_logger(__name__)

SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class RetrieverMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.queries = Counter("coda_retriever_queries_total", "Queries answered", ["mode"], registry=registry)
        self.batch_requests = Histogram(
            "coda_retriever_batch_requests",
            "Requests sharing one chunk of work",
            buckets=SIZE_BUCKETS,
            registry=registry,
        )
        self.batch_queries = Histogram(
            "coda_retriever_batch_queries", "Queries in one chunk of work", buckets=SIZE_BUCKETS, registry=registry
        )
        self.dropped = Counter(
            "coda_retriever_dropped_queries_total",
            "Queries never computed because their client disconnected",
            registry=registry,
        )
        self.stage = Histogram(
            "coda_retriever_stage_seconds",
            "Time per batch stage (encode/dense/sparse/fuse)",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.documents = Gauge("coda_retriever_documents", "Documents in the served index", registry=registry)

    def observe_batch(self, requests: int, queries: int) -> None:
        self.batch_requests.observe(requests)
        self.batch_queries.observe(queries)


def resolve(body: RetrieveRequest, settings: RetrieverSettings) -> SearchSpec:
    """The request with defaults filled in; ApiError (400) for what this server will not do."""
    if len(body.queries) > settings.max_queries:
        raise ApiError(
            f"{len(body.queries)} queries in one request; this server accepts at most "
            f"{settings.max_queries} (split the request)"
        )
    k = body.topk or settings.default_topk  # null and 0 both mean the default, as in Search-R1
    if k > settings.max_topk:
        raise ApiError(f"topk {k} is above this server's limit of {settings.max_topk}")
    depth = body.depth or settings.depth
    if depth > settings.max_depth:
        raise ApiError(f"depth {depth} is above this server's limit of {settings.max_depth}")
    mode = body.mode or settings.mode
    if settings.mode == "sparse" and mode != "sparse":  # refused here, not in a chunk shared with others
        raise ApiError(str(SparseOnlyError(mode)), param="mode")
    return SearchSpec(
        queries=body.queries,
        k=k,
        mode=mode,
        fusion=body.fusion or settings.fusion,
        sparse_weight=settings.sparse_weight if body.sparse_weight is None else body.sparse_weight,
        depth=depth,
        rrf_k=body.rrf_k or settings.rrf_k,
    )


def render(corpus: CorpusStore, ids: np.ndarray, scores: np.ndarray, return_scores: bool) -> bytes:
    """The response JSON, with each document's stored row bytes spliced in (no −1 slots, ever)."""
    lists = []
    for row_ids, row_scores in zip(ids.tolist(), scores.tolist(), strict=True):
        items = []
        for doc, score in zip(row_ids, row_scores, strict=True):
            if doc < 0 or not math.isfinite(score):
                continue
            raw = corpus.raw(doc)
            items.append(b'{"document":%s,"score":%s}' % (raw, format(score, ".7g").encode()) if return_scores else raw)
        lists.append(b"[" + b",".join(items) + b"]")
    return b'{"result":[' + b",".join(lists) + b"]}"


async def _disconnected(request: Request) -> None:
    """Returns once the client has disconnected (the body is already read: only a disconnect can come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_app(settings: RetrieverSettings) -> FastAPI:
    """The app for ``settings``; the index loads when the app starts (uvicorn lifespan)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        retriever = await asyncio.to_thread(
            load_retriever, settings, lambda stage, s: metrics.stage.labels(stage).observe(s)
        )
        metrics.documents.set(retriever.num_docs)
        batcher = MicroBatcher(
            retriever.search_many,
            workers=retriever.workers,
            chunk_queries=settings.chunk_queries,
            window_s=settings.batch_window_ms / 1000,
            on_batch=metrics.observe_batch,
            on_drop=metrics.dropped.inc,
            thread_init=retriever.prepare_thread,
            run_alone=functools.partial(retriever.search_many, wide=True),
        )
        await batcher.start()
        log.info("retriever workers", extra={"workers": retriever.workers, "chunk_queries": settings.chunk_queries})
        app.state.retriever, app.state.batcher = retriever, batcher
        try:
            yield
        finally:
            await batcher.stop()
            retriever.close()

    def index_ready() -> str:
        retriever = getattr(app.state, "retriever", None)
        if retriever is None:
            raise RuntimeError("index not loaded yet")
        return f"{retriever.num_docs} documents, dense={'off' if retriever.sparse_only else settings.dense_backend}"

    app, registry = create_app(
        "retriever",
        description=__doc__ or "",
        lifespan=lifespan,
        health_checks={"index": index_ready},
        max_body_bytes=settings.max_body_bytes,
    )
    metrics = RetrieverMetrics(registry)
    app.state.settings = settings

    @app.post(
        "/retrieve",
        response_model=RetrieveResponse,
        tags=["retrieval"],
        summary="Top-k documents for each query (Search-R1 compatible)",
    )
    async def retrieve(body: RetrieveRequest, request: Request) -> Response:
        spec = resolve(body, settings)
        if not spec.queries:
            return Response(b'{"result":[]}', media_type="application/json")
        job = asyncio.ensure_future(app.state.batcher.submit(spec))
        # The server does not cancel a handler whose client left; watch for the disconnect ourselves.
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait((job, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not job.done():  # the client left (or this handler was cancelled): drop the work
                job.cancel()
        if job.cancelled():
            return Response(status_code=499)  # nobody is listening; nginx's "client closed request"
        try:
            ids, scores = job.result()
        except BatcherStopped as exc:  # shutting down: a retryable 503, not a 500 or a hang
            raise ApiError(str(exc), 503, "ServiceUnavailableError") from exc
        metrics.queries.labels(spec.mode).inc(len(spec.queries))
        return Response(
            render(app.state.retriever.corpus, ids, scores, body.return_scores), media_type="application/json"
        )

    return app
