"""An aiohttp transport for ``/v1/completions`` on the rollout's hot path.

Same request body (``shared.inference_client.completion_body``) and the same parsing
(``parse_completion``) as the shared ``InferenceClient``; only the HTTP library differs. Measured side by side
on this project's 2-core host against the fake LLM (64 requests in flight, uvloop), httpx spent about 9 ms of
CPU per request (its pool scans every pooled connection on each request) and aiohttp about 0.8 ms, which
decides how many episodes one rollout process can keep in flight (``bench/rollout.py``).

Retries follow ``shared.transient``, the stack's one rule: 429, 502, 503, 504 and connection errors are sent
again with exponential backoff; a 500 or any other 4xx raises ``InferenceError`` at once. A timeout after the
request went out is transient but not sent again (``Failure.resend``): the server has the request and is still
working on it (a loaded CPU server can take minutes), and sending it again would double the work the wait was
for; the caller decides (the rollout treats it as an outage of the server and holds new groups).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from shared.auth import bearer_headers
from shared.inference_client import Completion, InferenceError, completion_body, parse_completion
from shared.inference_wire import COMPLETIONS, message_of
from shared.log import get_logger
from shared.retry import RetryPolicy
from shared.transient import classify, transient_status

log = get_logger(__name__)


class AiohttpCompletions:
    """``complete(model, prompt_ids, **sampling) -> Completion``, the subset of ``InferenceClient`` agents use."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        retry: RetryPolicy = RetryPolicy(),
        max_connections: int = 1024,
    ) -> None:
        self.url = base_url.rstrip("/") + COMPLETIONS
        self.retry, self.timeout_s, self.max_connections = retry, timeout_s, max_connections
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Created on first use: a session belongs to the event loop that is running then.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=10),
                headers=bearer_headers(),  # a vLLM with VLLM_API_KEY guards /v1/completions with the token
            )
        return self._session

    async def complete(self, model: str, prompt: list[int] | str, **sampling: Any) -> Completion:
        """``InferenceClient.complete`` over aiohttp: ``sampling`` takes ``completion_body``'s arguments."""
        body = completion_body(model, prompt, **sampling)
        for attempt in range(self.retry.attempts):
            last = attempt == self.retry.attempts - 1
            try:
                async with self._client().post(self.url, json=body) as response:
                    if response.status < 400:
                        return parse_completion(await response.json(content_type=None))
                    error = InferenceError(response.status, message_of(await response.text(), response.reason or ""))
                if not transient_status(response.status) or last:
                    raise error
                log.warning(
                    "inference server error, retrying", extra={"status": response.status, "attempt": attempt + 1}
                )
            except (aiohttp.ClientError, TimeoutError) as exc:
                if last or not classify(exc).resend:
                    raise
                log.warning(
                    "inference transport error, retrying", extra={"error": repr(exc)[:200], "attempt": attempt + 1}
                )
            await asyncio.sleep(self.retry.wait(attempt))
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
