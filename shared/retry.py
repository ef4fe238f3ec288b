"""Is a failure transient, and how do we send the request again? The one answer for every client and loop.

Transient: the dependency is not there or not serving, so waiting may help and the request is not to blame.
That is a refused, dropped or broken connection, a timeout, and the statuses 429, 502, 503 and 504. Clients
send such a request again a few times (``RetryPolicy``, the one retry loop: ``call``/``acall`` and
``request``/``arequest`` over httpx); loops that outlive a client's retries wait the dependency out (the
rollout's admission gate, the trainer's ``Patience``).

Not transient: any other 4xx (the request itself is wrong) and **500**. Our servers answer 500 for a failure
of that one request (the inference server: "an internal failure of one request is a 500 for that request
only"); a server that is down, restarting or overloaded refuses the connection or answers 502/503/504 (itself
or the proxy in front of it: the searcher answers an upstream failure with 502, the retriever a shutdown with
503), or 429. A 500 sent again does the work again (a whole generation) to fail again; counted as an outage,
a prompt that crashes the server would pause the rollout again and again instead of being dropped, and
weights that do not load would hold the trainer for its give-up time. So a 500 is the request's failure:
not resent, counted against the prompt, raised in the trainer.

One subtlety: a timeout after the request went out is transient (the server does not answer in time) but
is not *resent* by a client (``Failure.resend``): the server has the request and may still be working on it
(a loaded CPU server can take minutes), and sending it again would double the work the wait was for. The
caller decides (the rollout pauses admission and probes the server, the trainer waits and calls again).

``classify(exc, services)`` types a failure (``Failure``); its ``label`` is the ``cause`` label of the
rollout's failure metrics (``inference_http_503``, ``retriever_unreachable``, ``redis_error``), which
dashboards show, so those strings do not change.

Long-running loops wait out a dependency's outage (Redis, the inference server) instead of dying on it.
``Patience.call`` retries a call that failed for want of its dependency, with exponential backoff, until it
succeeds or ``give_up_s`` has passed since the first failure: one warning when the outage starts, one line
when the dependency is back, and ``DependencyDown`` when it never comes back (the only way an outage ends a
long-running service). Which failures are outages is the rule above (``is_outage``). A set
``stop`` event (SIGTERM) cuts any wait to ``stop_grace_s``: a service that was told to stop must not hang on a
dependency that is gone.

``Patient`` wraps a client (a redis client, ``SyncInferenceClient``) so that every method call waits out
outages. Only for calls that are safe to send twice: a reply lost to a dropped connection may belong to a
command the server did run.
"""

from __future__ import annotations

import asyncio
import functools
import random
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import redis

from shared.log import get_logger

__all__ = [
    "TRANSIENT_STATUS",
    "AnsweredError",
    "DependencyDown",
    "Failure",
    "Patience",
    "Patient",
    "RetryPolicy",
    "arequest",
    "classify",
    "is_outage",
    "request",
    "transient_status",
]

log = get_logger(__name__)
T = TypeVar("T")

TRANSIENT_STATUS = frozenset({429, 502, 503, 504})  # not 500: see the module docstring
# The server is not there or the connection broke; other transport errors (a URL without a scheme, a
# protocol error on our side) fail the same way every time.
_HTTPX_TRANSIENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError, httpx.ProxyError)
# Refused, dropped or timed-out connections (BusyLoadingError, a Redis still loading its data, is a
# ConnectionError); a ResponseError (WRONGTYPE, NOGROUP) is the command's own.
_REDIS_TRANSIENT = (redis.ConnectionError, redis.TimeoutError)


def transient_status(status: int) -> bool:
    """True for an HTTP status that says the server is not serving now (429, 502, 503, 504)."""
    return status in TRANSIENT_STATUS


class AnsweredError(Exception):
    """A server answered ``status_code`` with ``message``; ``service`` names it for ``classify`` (a client's
    error type sets it: ``shared.inference_client.InferenceError`` is ``inference``)."""

    service = "http"

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code, self.message = status_code, message


@dataclass(frozen=True)
class Failure:
    """What failed and how: ``service`` (``inference``, ``retriever``, ``searcher``, ``redis``; ``http`` for
    an HTTP call to an unnamed base URL; None for an error of our own code), ``kind`` (``http`` with
    ``status``, ``unreachable``, ``timeout``, ``error`` for Redis, else the exception's type name),
    ``transient`` (the module docstring's rule) and ``resend`` (a client may send the same request again
    at once: transient, and not a timeout after the request went out)."""

    service: str | None
    kind: str
    status: int | None = None
    transient: bool = False
    resend: bool = False

    @property
    def label(self) -> str:
        """The metric label (``inference_http_503``, ``retriever_timeout``, ``redis_error``, ``ValueError``)."""
        if self.service is None:
            return self.kind
        if self.status is not None:
            return f"{self.service}_http_{self.status}"
        return f"{self.service}_{self.kind}"


def _answered(service: str, status: int) -> Failure:
    transient = transient_status(status)
    return Failure(service, "http", status, transient, transient)


def classify(exc: BaseException, services: Mapping[str, str] | None = None) -> Failure:
    """The failure ``exc`` is; ``services`` (name → base URL) names the service an httpx error came from."""
    if isinstance(exc, AnsweredError):
        return _answered(exc.service, exc.status_code)
    aiohttp = sys.modules.get("aiohttp")  # not imported: no aiohttp error exists (the trainer does without it)
    if isinstance(exc, TimeoutError) or (aiohttp is not None and isinstance(exc, aiohttp.ClientError)):
        return _aiohttp_failure(exc, aiohttp)  # only the LLM hot path (``AiohttpCompletions``) uses aiohttp
    if isinstance(exc, redis.RedisError):
        transient = isinstance(exc, _REDIS_TRANSIENT)
        return Failure("redis", "error", None, transient, transient and not isinstance(exc, redis.TimeoutError))
    if isinstance(exc, httpx.HTTPError):
        return _httpx_failure(exc, services or {})
    return Failure(None, type(exc).__name__)


def _aiohttp_failure(exc: BaseException, aiohttp) -> Failure:
    if isinstance(exc, TimeoutError):
        # aiohttp's connect timeout: nothing was sent, so sending again is safe; any other timeout came after.
        connecting = aiohttp is not None and isinstance(exc, aiohttp.ConnectionTimeoutError)
        return Failure("inference", "timeout", None, True, connecting)
    transient = isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError)
    return Failure("inference", "unreachable", None, transient, transient)


def _httpx_failure(exc: httpx.HTTPError, services: Mapping[str, str]) -> Failure:
    url = str(exc.request.url) if getattr(exc, "_request", None) is not None else ""
    name = next((n for n, base in services.items() if base and url.startswith(base.rstrip("/"))), "http")
    if isinstance(exc, httpx.HTTPStatusError):
        return _answered(name, exc.response.status_code)
    transient = isinstance(exc, _HTTPX_TRANSIENT)
    if isinstance(exc, httpx.TimeoutException):
        # A read timeout comes after the request went out; connect, pool and write timeouts before it
        # was whole (a server cannot act on half a request).
        return Failure(name, "timeout", None, True, not isinstance(exc, httpx.ReadTimeout))
    return Failure(name, "unreachable", None, transient, transient)


@dataclass(frozen=True)
class RetryPolicy:
    """The one retry loop. ``call(send)`` and ``acall(send)`` run ``send`` until it returns, sending again
    what ``classify`` says may be resent, with exponential backoff, at most ``attempts`` times; both ask
    ``_backoff`` whether and how long to wait, so the sync and async loops cannot disagree."""

    attempts: int = 4  # total tries, the first included
    backoff_s: float = 0.2  # first wait; doubles each retry
    max_backoff_s: float = 5.0
    jitter: float = 0.25  # ± fraction of the wait, so clients do not retry in lockstep

    def wait(self, attempt: int) -> float:
        base = min(self.backoff_s * (2**attempt), self.max_backoff_s)
        return base * (1 + random.uniform(-self.jitter, self.jitter))

    def _backoff(self, attempt: int, exc: Exception, what: str) -> float | None:
        """Seconds to wait before sending again after try ``attempt`` (from 0) raised ``exc``; None to give
        up (it may not be resent, or the tries are spent)."""
        failure = classify(exc)
        if not failure.resend or attempt >= self.attempts - 1:
            return None
        extra = {"url": what, "cause": failure.label, "error": repr(exc)[:200], "attempt": attempt + 1}
        log.warning("transient failure, retrying", extra=extra)
        return self.wait(attempt)

    def call(self, send: Callable[[], T], what: str = "") -> T:
        """``send()``'s result, sending again (blocking sleeps) while it raises a failure that may be resent."""
        attempt = 0
        while True:
            try:
                return send()
            except Exception as exc:
                if (pause := self._backoff(attempt, exc, what)) is None:
                    raise
            time.sleep(pause)
            attempt += 1

    async def acall(self, send: Callable[[], Awaitable[T]], what: str = "") -> T:
        """``call`` for a coroutine function ``send``."""
        attempt = 0
        while True:
            try:
                return await send()
            except Exception as exc:
                if (pause := self._backoff(attempt, exc, what)) is None:
                    raise
            await asyncio.sleep(pause)
            attempt += 1


async def arequest(
    client: httpx.AsyncClient, method: str, url: str, *, policy: RetryPolicy = RetryPolicy(), **kwargs
) -> httpx.Response:
    """``client.request`` with retries; raises ``httpx.HTTPStatusError`` for a final 4xx/5xx."""

    async def send() -> httpx.Response:
        return (await client.request(method, url, **kwargs)).raise_for_status()

    return await policy.acall(send, url)


def request(
    client: httpx.Client, method: str, url: str, *, policy: RetryPolicy = RetryPolicy(), **kwargs
) -> httpx.Response:
    """Synchronous ``arequest`` for the trainer and CLIs."""
    return policy.call(lambda: client.request(method, url, **kwargs).raise_for_status(), url)


# ---------------------------------------------------------------- waiting out an outage


class DependencyDown(RuntimeError):
    """A dependency stayed unreachable past the give-up time (or past the grace of a stopping service)."""


def is_outage(exc: BaseException) -> bool:
    """True when ``exc`` says the dependency is unreachable or not serving, not that the request itself was
    wrong: a transient failure (``shared.retry``). A 500 is not one: weights that do not load fail again
    however long we wait."""
    return classify(exc).transient


@dataclass
class Patience:
    """How long to wait out an outage, and the event that cuts a wait short (see the module docstring)."""

    give_up_s: float = 600.0
    stop: threading.Event | None = None
    stop_grace_s: float = 5.0  # how long a stopping service still retries (e.g. its last ack)
    backoff_s: float = 0.1  # first wait; doubles after each failure
    max_backoff_s: float = 5.0

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, retried while ``what`` (a name for the logs) is unreachable."""
        down_since = stop_deadline = None
        wait = self.backoff_s
        while True:
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                now = time.monotonic()
                error = f"{type(exc).__name__}: {exc}"[:300]
                if down_since is None:
                    down_since = now
                    log.warning(
                        f"{what} unreachable: waiting for it",
                        extra={"dependency": what, "error": error, "give_up_s": self.give_up_s},
                    )
                deadline = down_since + self.give_up_s
                if self.stop is not None and self.stop.is_set():
                    stop_deadline = stop_deadline or now + self.stop_grace_s
                    deadline = min(deadline, stop_deadline)
                if now >= deadline:
                    why = "while stopping" if stop_deadline is not None else f"(give-up {self.give_up_s:.0f}s)"
                    raise DependencyDown(f"{what} unreachable for {now - down_since:.1f}s {why}: {error}") from exc
                self._sleep(min(wait, deadline - now))
                wait = min(wait * 2, self.max_backoff_s)
                continue
            if down_since is not None:
                log.info(
                    f"{what} is back", extra={"dependency": what, "down_s": round(time.monotonic() - down_since, 1)}
                )
            return result

    def _sleep(self, seconds: float) -> None:
        # A SIGTERM during a long backoff should not wait the backoff out; once stopping, plain sleeps
        # (the stop event stays set, so waiting on it would return at once and spin).
        if self.stop is not None and not self.stop.is_set():
            self.stop.wait(seconds)
        else:
            time.sleep(seconds)


class Patient:
    """``client`` with every method call waiting out outages of ``what`` (idempotent calls only).

    A redis client's ``pipeline()`` comes back as a ``_ReplayedPipeline``: redis-py empties a pipeline
    whatever ``execute`` did, so a retried ``execute`` would send nothing; ours records the commands and
    replays them into a fresh pipeline on each try. Not for reading a stream with a consumer group: a
    retried XREADGROUP whose reply was lost skips the entries it delivered (``StreamQueue.read`` handles it).
    """

    def __init__(self, client: Any, patience: Patience, what: str) -> None:
        self.client = client
        self.patience = patience
        self.what = what

    def pipeline(self, transaction: bool = True) -> _ReplayedPipeline:
        return _ReplayedPipeline(self, transaction)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def waiting(*args: Any, **kwargs: Any) -> Any:
            return self.patience.call(self.what, attr, *args, **kwargs)

        return waiting


class _ReplayedPipeline:
    """Records ``pipe.<command>(...)`` calls; ``execute`` sends them all, as one transaction, until it goes through."""

    def __init__(self, owner: Patient, transaction: bool) -> None:
        self._owner = owner
        self._transaction = transaction
        self._commands: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str) -> Callable[..., _ReplayedPipeline]:
        def record(*args: Any, **kwargs: Any) -> _ReplayedPipeline:
            self._commands.append((name, args, kwargs))
            return self

        return record

    def __enter__(self) -> _ReplayedPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self._commands = []

    def execute(self) -> list[Any]:
        def send() -> list[Any]:
            pipe = self._owner.client.pipeline(transaction=self._transaction)
            for name, args, kwargs in self._commands:
                getattr(pipe, name)(*args, **kwargs)
            return pipe.execute()

        try:
            return self._owner.patience.call(self._owner.what, send)
        finally:
            self._commands = []
