"""The rollout's completions transport against a real slow HTTP server: a timeout is not sent again (the
server is still working on the request); a refused connection, a 503 and a 429 are retried, a 500 is not."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from shared.inference_client import AiohttpCompletions, InferenceError
from shared.redis_server import free_port
from shared.retry import RetryPolicy
from tests.integration.rollout.servers import completions_stub


async def test_a_timed_out_completion_is_not_resubmitted():
    calls = 0

    async def slow(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        await asyncio.sleep(2)
        return web.json_response({})

    async with completions_stub(slow) as url:
        llm = AiohttpCompletions(url, timeout_s=0.3, retry=RetryPolicy(attempts=3, backoff_s=0.01))
        try:
            with pytest.raises(asyncio.TimeoutError):
                await llm.complete("policy", [1, 2, 3], max_tokens=4)
            assert calls == 1
        finally:
            await llm.aclose()


async def test_a_refused_connection_is_retried(caplog):
    llm = AiohttpCompletions(f"http://127.0.0.1:{free_port()}", retry=RetryPolicy(attempts=3, backoff_s=0.01))
    try:
        with pytest.raises(Exception, match="onnect"):
            await llm.complete("policy", [1, 2, 3], max_tokens=4)
    finally:
        await llm.aclose()
    assert caplog.text.count("transient failure, retrying") == 2


@pytest.mark.parametrize(("status", "calls"), [(500, 1), (503, 3), (429, 3), (404, 1)])
async def test_statuses_follow_the_one_transient_rule(status, calls):
    seen = 0

    async def failing(request: web.Request) -> web.Response:
        nonlocal seen
        seen += 1
        return web.json_response({"error": {"message": f"answered {status}"}}, status=status)

    async with completions_stub(failing) as url:
        llm = AiohttpCompletions(url, retry=RetryPolicy(attempts=3, backoff_s=0.01))
        try:
            with pytest.raises(InferenceError, match=f"answered {status}") as raised:
                await llm.complete("policy", [1, 2, 3], max_tokens=4)
            assert raised.value.status_code == status and seen == calls  # 500: the request's own failure, once
        finally:
            await llm.aclose()
