"""Waiting out a dependency's outage (Redis, the inference server) instead of dying on it.

``Patience.call`` retries a call that failed for want of its dependency, with exponential backoff, until it
succeeds or ``give_up_s`` has passed since the first failure: one warning when the outage starts, one line
when the dependency is back, and ``DependencyDown`` when it never comes back (the only way an outage ends a
long-running service). Which failures are outages is ``shared.retry``'s rule (``is_outage``). A set
``stop`` event (SIGTERM) cuts any wait to ``stop_grace_s``: a service that was told to stop must not hang on a
dependency that is gone.

``Patient`` wraps a client (a redis client, ``SyncInferenceClient``) so that every method call waits out
outages. Only for calls that are safe to send twice: a reply lost to a dropped connection may belong to a
command the server did run.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from shared.log import get_logger
from shared.retry import classify

log = get_logger(__name__)

T = TypeVar("T")


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
