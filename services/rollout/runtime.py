"""Builds the pooled clients and the ``AgentContext`` from settings (shared by ``serve`` and ``eval``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx

from agents.core.episode import AgentContext
from agents.core.llm import FrozenGenerator, PolicyGenerator, PolicyState, Sampling
from agents.core.searcher_client import AsyncSearcherClient
from agents.prompts import TokenizerLike, env_frame, load_tokenizer
from agents.search_r1 import SearchR1Params
from agents.single_turn import SingleTurnParams
from services.rollout.config import RolloutSettings
from shared.inference_client import AiohttpCompletions, InferenceClient
from shared.retriever_client import AsyncRetrieverClient, BatchingRetriever
from shared.retry import RetryPolicy


def llm_client(settings: RolloutSettings, url: str) -> InferenceClient | AiohttpCompletions:
    """The pooled completions client of one policy server (``llm_http`` picks the HTTP library)."""
    policy_retry = RetryPolicy(attempts=settings.retry_attempts, backoff_s=settings.retry_backoff_s)
    # Keep-alive for every pooled connection: with many episodes in flight, a smaller keep-alive pool
    # closes and reopens TCP connections on every call.
    pool = 2 * settings.max_running_groups * settings.n_samples
    if settings.llm_http == "aiohttp":
        return AiohttpCompletions(url, timeout_s=settings.http_timeout_s, retry=policy_retry, max_connections=pool)
    return InferenceClient(
        url,
        timeout=httpx.Timeout(settings.http_timeout_s, connect=10.0),
        retry=policy_retry,
        limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
    )


@contextlib.asynccontextmanager
async def agent_context(
    settings: RolloutSettings, *, greedy: bool = False, tok: TokenizerLike | None = None
) -> AsyncIterator[AgentContext]:
    """An ``AgentContext`` with pooled clients for ``settings.agent``; closes them on exit."""
    policy_retry = RetryPolicy(attempts=settings.retry_attempts, backoff_s=settings.retry_backoff_s)
    llm = llm_client(settings, settings.inference_url)
    needs = settings.agent_spec.needs
    retriever = (
        AsyncRetrieverClient(
            settings.retriever_url, timeout_s=settings.http_timeout_s, policy=policy_retry, max_connections=256
        )
        if "retriever" in needs
        else None
    )
    if retriever is not None and settings.retrieval_batch_ms > 0:
        retriever = BatchingRetriever(retriever, window_s=settings.retrieval_batch_ms / 1000)
    searcher = (
        AsyncSearcherClient(settings.searcher_url, timeout_s=settings.http_timeout_s, policy=policy_retry)
        if "searcher" in needs
        else None
    )
    state = PolicyState(version=0, model_name=settings.served_model_name, served_model_name=settings.served_model_name)
    sampling = Sampling.greedy() if greedy else Sampling(settings.temperature, settings.top_p, settings.top_k)
    frozen = FrozenGenerator(
        llm, settings.frozen_model_name or settings.served_model_name, Sampling(settings.frozen_temperature, 1.0)
    )
    tok = tok or load_tokenizer(settings.tokenizer, settings.system_prompt)
    ctx = AgentContext(
        tok=tok,
        policy=PolicyGenerator(llm, state, sampling),
        retriever=retriever,
        frozen=frozen,
        searcher=searcher,
        budgets=settings.budgets(),
        topk=settings.topk,
        searcher_max_turns=SearchR1Params.of(settings).searcher_max_turns,
        stop=tuple(SingleTurnParams.of(settings).stop),
        env_frame=env_frame(tok, settings.env_turn),
    )
    try:
        yield ctx
    finally:
        await llm.aclose()
        for client in (retriever, searcher):
            if client is not None:
                await client.aclose()
