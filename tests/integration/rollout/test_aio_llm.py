"""The rollout's completions transport against a real slow HTTP server: a timeout is not sent again (the
server is still working on the request); a refused connection is retried."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from recipes.core.aio_llm import AiohttpCompletions
from shared.redis_server import free_port
from shared.retry import RetryPolicy


async def test_a_timed_out_completion_is_not_resubmitted():
    calls = 0

    async def slow(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        await asyncio.sleep(2)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/completions", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    llm = AiohttpCompletions(f"http://127.0.0.1:{port}", timeout_s=0.3, retry=RetryPolicy(attempts=3, backoff_s=0.01))
    try:
        with pytest.raises(asyncio.TimeoutError):
            await llm.complete("policy", [1, 2, 3], max_tokens=4)
        assert calls == 1
    finally:
        await llm.aclose()
        await runner.cleanup()


async def test_a_refused_connection_is_retried(caplog):
    llm = AiohttpCompletions(f"http://127.0.0.1:{free_port()}", retry=RetryPolicy(attempts=3, backoff_s=0.01))
    try:
        with pytest.raises(Exception, match="onnect"):
            await llm.complete("policy", [1, 2, 3], max_tokens=4)
    finally:
        await llm.aclose()
    assert caplog.text.count("inference transport error, retrying") == 2
