"""Bounded retries for HTTP calls between services: send again, with exponential backoff, what
``shared.transient`` calls transient (429, 502, 503, 504, refused or dropped connections, timeouts before the
request went out); never a 500 or another 4xx (the request itself failed, so sending it again cannot help),
nor a request that timed out after it went out (the server may still be working on it).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import httpx

from shared.log import get_logger
from shared.transient import classify, transient_status

log = get_logger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4  # total tries, the first included
    backoff_s: float = 0.2  # first wait; doubles each retry
    max_backoff_s: float = 5.0
    jitter: float = 0.25  # ± fraction of the wait, so clients do not retry in lockstep

    def wait(self, attempt: int) -> float:
        base = min(self.backoff_s * (2**attempt), self.max_backoff_s)
        return base * (1 + random.uniform(-self.jitter, self.jitter))


async def arequest(
    client: httpx.AsyncClient, method: str, url: str, *, policy: RetryPolicy = RetryPolicy(), **kwargs
) -> httpx.Response:
    """``client.request`` with retries; raises ``httpx.HTTPStatusError`` for a final 4xx/5xx."""
    for attempt in range(policy.attempts):
        last = attempt == policy.attempts - 1
        try:
            response = await client.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            if last or not classify(exc).resend:
                raise
            log.warning(
                "transient HTTP error, retrying", extra={"url": url, "error": repr(exc), "attempt": attempt + 1}
            )
        else:
            if not transient_status(response.status_code) or last:
                return response.raise_for_status()
            log.warning(
                "server error, retrying", extra={"url": url, "status": response.status_code, "attempt": attempt + 1}
            )
        await asyncio.sleep(policy.wait(attempt))
    raise AssertionError("unreachable")


def request(
    client: httpx.Client, method: str, url: str, *, policy: RetryPolicy = RetryPolicy(), **kwargs
) -> httpx.Response:
    """Synchronous twin of ``arequest`` for the trainer and CLIs."""
    for attempt in range(policy.attempts):
        last = attempt == policy.attempts - 1
        try:
            response = client.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            if last or not classify(exc).resend:
                raise
            log.warning(
                "transient HTTP error, retrying", extra={"url": url, "error": repr(exc), "attempt": attempt + 1}
            )
        else:
            if not transient_status(response.status_code) or last:
                return response.raise_for_status()
            log.warning(
                "server error, retrying", extra={"url": url, "status": response.status_code, "attempt": attempt + 1}
            )
        time.sleep(policy.wait(attempt))
    raise AssertionError("unreachable")
