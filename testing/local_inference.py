"""Run the inference server in-process on a background thread (tests, notebooks, the embedded default).

with serve_in_thread(InferenceSettings(model=dir, port=free_port(), weights_root=root)) as url:
    client = SyncInferenceClient(url)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

from services.inference.app import create_inference_app
from services.inference.config import InferenceSettings


@contextmanager
def serve_in_thread(
    settings: InferenceSettings, startup_timeout_s: float = 120.0, app: FastAPI | None = None
) -> Iterator[str]:
    """Start uvicorn on ``settings.host:settings.port``; yields the base URL; stops the server on exit.

    Pass ``app`` (from ``create_inference_app(settings)``) to keep a handle on ``app.state.server``, e.g. for a
    test that injects a fault into the engine it serves.
    """
    app = app if app is not None else create_inference_app(settings)
    server = uvicorn.Server(
        uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name="inference-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("inference server failed to start (see the log above)")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"inference server did not start within {startup_timeout_s:.0f}s")
        time.sleep(0.05)
    try:
        yield f"http://{settings.host}:{settings.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
