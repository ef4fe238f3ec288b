"""Run an ASGI app with uvicorn in a background thread on 127.0.0.1 (tests and benchmarks)."""

from __future__ import annotations

import threading
import time

import httpx
import uvicorn

from shared.redis_server import free_port


class ThreadedServer:
    """``with ThreadedServer(app) as url: ...`` — a real HTTP server, stopped on exit."""

    def __init__(self, app, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
            timeout_keep_alive=30,
            backlog=4096,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self, timeout_s: float = 20.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.server.started:
                return self.url
            if not self.thread.is_alive():
                raise RuntimeError(f"server on port {self.port} exited during startup")
            time.sleep(0.02)
        raise TimeoutError(f"server on port {self.port} did not start within {timeout_s}s")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_healthy(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url.rstrip("/") + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not healthy after {timeout_s}s")
