"""A small process supervisor: start services in order, wait for their ``/health``, watch them, stop them all.

Every child runs in its own process group with its output in a log file; when one dies unexpectedly the
supervisor stops the rest and reports the tail of that log. Ctrl-C, SIGTERM, SIGHUP (the terminal closed)
and normal exit all stop the children (SIGTERM, then SIGKILL after a grace period), newest first. The grace
is per service: the trainer writes a checkpoint when told to stop, which for a real model takes far longer
than a web server's exit. A supervisor that dies without stopping them (SIGKILL, an OOM kill) still takes
them along: on Linux each child asks the kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), so
the trainer checkpoints and every service exits rather than training on under PID 1.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from shared.log import get_logger

log = get_logger(__name__)


class ServiceFailed(RuntimeError):
    """A supervised process exited or never became healthy."""


@dataclass
class Service:
    name: str
    cmd: list[str]
    health_url: str | None = None  # polled until 200; None: ready once started
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 180.0
    stop_grace_s: float | None = None  # SIGTERM → SIGKILL; None: the supervisor's default
    one_shot: bool = False  # a job run beside the others: exiting with 0 is finishing, not dying
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    def tail(self, lines: int = 30) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class Supervisor:
    """Owns a set of child processes; use as a context manager so they are always stopped."""

    WAIT_LOG_S = 10.0  # while a service takes its time to stop, say so this often

    def __init__(self, log_dir: str | Path, grace_s: float = 15.0) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.grace_s = grace_s
        self.services: list[Service] = []

    def start(self, service: Service, *, wait: bool = True) -> Service:
        """Launch ``service``; with ``wait`` (default), return once it is healthy. ``wait=False`` lets several
        start at once (``wait_healthy`` each afterwards): their start-up costs overlap."""
        service.log_path = self.log_dir / f"{service.name}.log"
        out = service.log_path.open("ab")
        env = {**os.environ, **service.env}
        log.info(
            "starting service",
            extra={"service": service.name, "cmd": " ".join(service.cmd), "log": str(service.log_path)},
        )
        service.proc = subprocess.Popen(
            service.cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with(os.getpid()),
        )
        out.close()
        self.services.append(service)
        if wait:
            self.wait_healthy(service)
        return service

    def wait_healthy(self, service: Service) -> None:
        if service.health_url is None:
            return
        deadline = time.monotonic() + service.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                self._check_alive(service)
                try:
                    if client.get(service.health_url).status_code == 200:
                        log.info("service healthy", extra={"service": service.name})
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        raise ServiceFailed(
            f"{service.name} was not healthy within {service.startup_timeout_s:.0f}s "
            f"({service.health_url}); last log lines:\n{service.tail()}"
        )

    def _check_alive(self, service: Service) -> None:
        if service.proc and service.proc.poll() is not None:
            if service.one_shot and service.proc.returncode == 0:
                return
            raise ServiceFailed(
                f"{service.name} exited with code {service.proc.returncode}; last log lines:\n{service.tail()}"
            )

    def check(self) -> None:
        """Raise if any long-running child has died."""
        for service in self.services:
            self._check_alive(service)

    def wait_for(
        self,
        service: Service,
        timeout_s: float | None = None,
        on_tick: Callable[[], None] | None = None,
        tick_s: float = 5.0,
    ) -> int:
        """Wait for ``service`` to exit by itself while the others stay up; returns its exit code."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        last_tick = time.monotonic()
        while service.proc.poll() is None:
            for other in self.services:
                if other is not service:
                    self._check_alive(other)
            if deadline is not None and time.monotonic() > deadline:
                raise ServiceFailed(f"{service.name} did not finish within {timeout_s:.0f}s")
            if on_tick and time.monotonic() - last_tick >= tick_s:
                on_tick()
                last_tick = time.monotonic()
            time.sleep(0.5)
        return service.proc.returncode

    def stop(self, service: Service) -> None:
        """Stop one service (if still running) and stop watching it."""
        self._stop(service)
        if service in self.services:
            self.services.remove(service)

    def stop_all(self) -> None:
        for service in reversed(self.services):
            self._stop(service)
        self.services.clear()

    def _stop(self, service: Service) -> None:
        proc = service.proc
        if proc is None or proc.poll() is not None:
            return
        grace = self.grace_s if service.stop_grace_s is None else service.stop_grace_s
        log.info("stopping service", extra={"service": service.name, "grace_s": grace})
        start = time.monotonic()
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            while True:
                try:
                    proc.wait(timeout=max(0.0, min(start + grace - time.monotonic(), self.WAIT_LOG_S)))
                    return
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= start + grace:
                        break
                    log.info(
                        "waiting for service to stop",
                        extra={"service": service.name, "waited_s": round(time.monotonic() - start), "grace_s": grace},
                    )
            log.warning(
                "service did not stop within its grace, killing", extra={"service": service.name, "grace_s": grace}
            )
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass

    def __enter__(self) -> Supervisor:
        # SIGTERM and SIGHUP behave like Ctrl-C, so that ``__exit__`` runs and stops the children either way.
        self._previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop_all()
        finally:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


_PR_SET_PDEATHSIG = 1
# Loaded before any fork: the child between fork and exec may only make async-signal-safe calls.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def _die_with(parent: int) -> Callable[[], None] | None:
    """The child's pre-exec hook: SIGTERM when ``parent`` dies (Linux; elsewhere None, no hook).

    The kernel sends it when the thread that forked the child exits: services are started from the
    supervisor's main thread, which lives as long as the supervisor does."""
    if _LIBC is None:
        return None

    def hook() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # it died before the request was made: nobody would send the signal
            os.kill(os.getpid(), signal.SIGTERM)

    return hook
