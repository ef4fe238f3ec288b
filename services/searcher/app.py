"""The searcher's FastAPI app: ``POST /search``, ``/health``, ``/metrics``.

Each request runs its own episode (``services.searcher.loop.run_searcher``) with its own ``max_turns``;
nothing per request is stored on the app, so concurrent requests never see each other's settings.
An upstream failure (LLM or retriever down after retries) answers 502 with the cause, never a 500.
"""

from __future__ import annotations

import contextlib
import time

import httpx
from fastapi import FastAPI
from prometheus_client import Counter, Histogram

from agents.core.episode import AgentContext
from agents.core.llm import FrozenGenerator, Sampling
from agents.prompts import CharTokenizer, HFTokenizer
from services.searcher.config import SearcherSettings
from services.searcher.loop import run_searcher
from shared.http import ApiError, create_app
from shared.inference_client import InferenceClient, InferenceError
from shared.log import get_logger
from shared.metrics import LATENCY_BUCKETS
from shared.protocol.search import SearchRequest, SearchResponse
from shared.retriever_client import AsyncRetrieverClient
from shared.retry import RetryPolicy

log = get_logger(__name__)


def build_app(settings: SearcherSettings, *, tok=None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        retry = RetryPolicy(attempts=settings.retry_attempts)
        llm = InferenceClient(
            settings.inference_url, retry=retry, timeout=httpx.Timeout(settings.http_timeout_s, connect=10.0)
        )
        retriever = AsyncRetrieverClient(settings.retriever_url, timeout_s=settings.http_timeout_s, policy=retry)
        tokenizer = tok or (CharTokenizer() if settings.tokenizer == "char" else HFTokenizer(settings.tokenizer))
        frozen = FrozenGenerator(llm, settings.served_model_name, Sampling(settings.temperature, 1.0))
        app.state.ctx = AgentContext(
            tok=tokenizer,
            policy=frozen,
            frozen=frozen,
            retriever=retriever,
            budgets={"searcher": settings.budget()},
            topk=settings.topk,
        )
        try:
            yield
        finally:
            await llm.aclose()
            await retriever.aclose()

    app, registry = create_app(
        "searcher",
        lifespan=lifespan,
        description=__doc__ or "",
        health_checks={"model": lambda: settings.served_model_name},
    )
    requests = Counter("coda_searcher_requests_total", "Search requests by outcome", ["outcome"], registry=registry)
    searches = Histogram(
        "coda_searcher_searches_per_request",
        "Retriever calls per request",
        buckets=(0, 1, 2, 3, 4, 6, 8),
        registry=registry,
    )
    seconds = Histogram(
        "coda_searcher_request_seconds", "Search episode time", buckets=LATENCY_BUCKETS, registry=registry
    )

    @app.post(
        "/search",
        response_model=SearchResponse,
        tags=["search"],
        summary="Run a multi-turn search for one query and return the answer",
    )
    async def search(body: SearchRequest) -> SearchResponse:
        max_turns = body.max_turns or settings.max_turns
        if max_turns > settings.max_turns_limit:
            raise ApiError(f"max_turns {max_turns} exceeds this server's limit of {settings.max_turns_limit}")
        if not body.query.strip():
            raise ApiError("query must not be blank")
        start = time.perf_counter()
        try:
            result = await run_searcher(app.state.ctx, body.query, max_turns)
        except (InferenceError, httpx.HTTPError) as exc:
            requests.labels("upstream_error").inc()
            log.warning("search failed upstream", extra={"error": repr(exc)[:300]})
            raise ApiError(f"upstream failure: {exc}", 502, "BadGatewayError") from None
        requests.labels("answered" if result.success else "no_answer").inc()
        searches.observe(result.num_searches)
        seconds.observe(time.perf_counter() - start)
        return result

    return app
