"""Continuous batching: one engine thread owns the model and runs one forward pass per decoding step for every
running sequence, admitting new requests between steps.

Weight changes (LoRA load/unload, full reload) are control operations run by the same thread between steps,
so a forward pass never sees weights change under it. A full reload also *drains*: admission stops, running
requests finish on the old weights, then the new weights go in and the version goes up. Every request is
admitted whole (all its choices at once), so each response comes from exactly one weight version, which it
reports.

The steps themselves, and the isolation of one request's failure from the others, are ``RunningBatch``'s
(``batch.py``); a fault outside any one request's work fails everything in flight. ``check_health`` reports a
paused engine, one whose steps keep failing, and a dead thread; requests never hang on a paused or dead one.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from services.inference.batch import EngineMetrics, RunningBatch
from services.inference.model import ModelRunner
from services.inference.sampling import LogprobsMode
from services.inference.sequences import GenerationRequest, Sequence, make_generators, resolve
from shared.log import get_logger

__all__ = ["AdapterNotLoaded", "Engine", "EnginePaused", "GenerationRequest", "Sequence", "make_generators"]

log = get_logger(__name__)

# This many failed steps in a row (every request in them failed) and /health calls the engine broken.
FAILING_AFTER = 3


class AdapterNotLoaded(LookupError):
    """A request names an adapter that was unloaded while it waited."""


class EnginePaused(RuntimeError):
    """A request waited ``pause_wait_s`` for ``/resume`` and was refused (the route answers 503)."""


@dataclass
class _Op:
    run: Callable[[], Any]
    ready: Callable[[], bool] | None  # run only once this holds (checked between steps); None = at once
    future: Future = field(default_factory=Future)


class Engine(RunningBatch):
    """A ``RunningBatch`` plus the thread that runs it: the waiting queue, control ops, pause, health."""

    def __init__(
        self,
        runner: ModelRunner,
        *,
        max_num_seqs: int = 128,
        logprobs_mode: LogprobsMode = "raw_logprobs",
        seed: int = 0,
        metrics: EngineMetrics | None = None,
        prefix_cache_tokens: int | None = 0,
        prefix_cache_bytes: int | None = None,
        max_prefill_batch: int = 16,
        pause_wait_s: float = 60.0,
    ) -> None:
        super().__init__(
            runner,
            logprobs_mode=logprobs_mode,
            seed=seed,
            metrics=metrics,
            prefix_cache_tokens=prefix_cache_tokens,
            max_prefill_batch=max_prefill_batch,
            prefix_cache_bytes=prefix_cache_bytes,
        )
        self.max_num_seqs, self.pause_wait_s = max_num_seqs, pause_wait_s
        self.version = 0
        self.waiting: deque[GenerationRequest] = deque()
        self.ops: deque[_Op] = deque()
        self.paused = False  # vLLM's /pause?mode=wait: no admission until /resume
        self.paused_at = 0.0
        self.fatal: BaseException | None = None  # what killed the engine thread, if anything did
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="inference-engine", daemon=True)

    # -- public API (any thread) ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify_all()
        self._thread.join(timeout=10)

    def submit(self, request: GenerationRequest) -> Future:
        with self._wake:
            if self._stopped:  # nobody would ever complete it
                resolve(request.future, error=RuntimeError(f"inference engine stopped{self._why()}"))
                return request.future
            self.waiting.append(request)
            self._wake.notify_all()
        return request.future

    def control(self, run: Callable[[], Any], ready: Callable[[], bool] | None = None) -> Future:
        """Run ``run()`` on the engine thread between steps, once ``ready()`` holds.

        While an op waits for ``ready`` no new request is admitted (running ones go on), so a drain finishes.
        """
        op = _Op(run, ready)
        with self._wake:
            if self._stopped:
                op.future.set_exception(RuntimeError(f"inference engine stopped{self._why()}"))
                return op.future
            self.ops.append(op)
            self._wake.notify_all()
        return op.future

    def set_paused(self, paused: bool) -> None:
        """/pause and /resume (engine thread). Requests arriving while paused wait up to ``pause_wait_s``."""
        with self._wake:
            self.paused, self.paused_at = paused, time.monotonic()
            self._wake.notify_all()

    def check_health(self) -> str:
        """A one-line state for /health; raises when the engine cannot serve (paused, failing, dead)."""
        if self.fatal is not None or not self._thread.is_alive():
            raise RuntimeError(f"engine thread is not running{self._why()}")
        if self.consecutive_failures >= FAILING_AFTER:
            raise RuntimeError(
                f"engine failing: every request of the last {self.consecutive_failures} steps "
                f"failed, last with {type(self.last_error).__name__}: {self.last_error}"
            )
        if self.paused:
            raise RuntimeError(
                f"paused by /pause {time.monotonic() - self.paused_at:.0f}s ago: no request is "
                f"admitted until /resume ({self.num_waiting} waiting)"
            )
        return f"running={self.num_running} waiting={self.num_waiting}"

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def _why(self) -> str:
        return f" ({type(self.fatal).__name__}: {self.fatal})" if self.fatal is not None else ""

    # -- engine thread -------------------------------------------------------------------------------------
    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        try:
            self._serve()
        except BaseException as exc:  # logged here; re-raising would only print it again (threading.excepthook)
            self.fatal = exc
            log.exception("inference engine thread died")
        finally:
            with self._wake:
                self._stopped = True  # submit() fails from now on instead of queueing into the void
            self._fail_running(RuntimeError(f"inference engine stopped{self._why()}"))

    def _serve(self) -> None:
        while True:
            with self._wake:
                self._expire_paused()
                while not (self._stopped or self.running or self.ops or (self.waiting and not self.paused)):
                    self._wake.wait(self._pause_deadline())
                    self._expire_paused()
                if self._stopped:
                    return
            try:
                blocked = self._run_ops()
                if not blocked and not self.paused:
                    self._admit()
                if self.running:
                    self._step()
            except Exception as exc:  # not any one request's fault: fail the requests in flight, not hang them
                log.exception("engine step failed; failing running requests")
                self.consecutive_failures += 1
                self.last_error = exc
                self._fail_running(exc)

    def _pause_deadline(self) -> float | None:
        """Seconds until the first request waiting on a pause runs out of patience; None: nothing to time."""
        if not (self.paused and self.waiting):
            return None
        first = min(max(r.arrived, self.paused_at) for r in self.waiting)
        return max(0.0, first + self.pause_wait_s - time.monotonic())

    def _expire_paused(self) -> None:
        """Refuse requests that waited ``pause_wait_s`` for /resume (caller holds the lock)."""
        if not (self.paused and self.waiting):
            return
        now, kept = time.monotonic(), deque()
        for request in self.waiting:
            waited = now - max(request.arrived, self.paused_at)
            if waited < self.pause_wait_s:
                kept.append(request)
            else:
                resolve(
                    request.future,
                    error=EnginePaused(
                        f"the engine is paused (POST /pause, e.g. for a weight update) and was not resumed within "
                        f"{self.pause_wait_s:g}s; retry later"
                    ),
                )
        self.waiting = kept

    def _run_ops(self) -> bool:
        """Apply queued control ops in order; True while one waits for a drain (admission paused)."""
        while self.ops:
            op = self.ops[0]
            try:
                if op.ready is not None and not op.ready():
                    return True
            except Exception as exc:  # that op fails; raising would retry it (and fail everything) forever
                self.ops.popleft()
                resolve(op.future, error=exc)
                continue
            self.ops.popleft()
            if not op.future.set_running_or_notify_cancel():
                continue  # the caller went away before it ran: nothing to do
            try:
                op.future.set_result(op.run())
            except Exception as exc:
                op.future.set_exception(exc)
        return False

    def _admit(self) -> None:
        """Admit whole waiting requests while seats are free, and prefill them together."""
        admitted: list[GenerationRequest] = []
        seats = self.max_num_seqs - len(self.running)
        while self.waiting:
            request = self.waiting[0]
            size = len(request.sequences)
            if (self.running or admitted) and size > seats:
                break
            self.waiting.popleft()
            missing = request.adapters - self.runner.adapters
            if request.future.cancelled():
                continue
            if missing:
                resolve(
                    request.future, error=AdapterNotLoaded(f"The lora adapter '{sorted(missing)[0]}' cannot be found.")
                )
                continue
            request.version = self.version
            admitted.append(request)
            seats -= size
        if admitted:
            self._prefill(admitted)
            if all(r.future.done() and not r.future.cancelled() and r.future.exception() for r in admitted):
                self.consecutive_failures += 1

    def _fail_running(self, exc: BaseException) -> None:
        with self._wake:
            waiting, self.waiting = list(self.waiting), deque()
        for request in waiting:
            resolve(request.future, error=exc)
        self._fail_batch(exc)
