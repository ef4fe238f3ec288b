"""``SyncInferenceClient``: the inference client (``shared.inference_client.InferenceClient``) for synchronous
callers (the trainer, CLIs). It runs the async client's coroutines on a private event-loop thread and adds
nothing: same wire, same retries, same errors (``InferenceError``).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

import httpx

from shared.inference_client import DEFAULT_LIMITS, DEFAULT_TIMEOUT, Completion, InferenceClient
from shared.protocol.inference import ModelCard
from shared.retry import RetryPolicy

__all__ = ["SyncInferenceClient"]

T = TypeVar("T")


class SyncInferenceClient:
    """``InferenceClient`` for blocking code (the trainer, CLIs): each method runs the async client's on a
    private event loop in a daemon thread, so it works from any thread, one with a running loop included."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        retry: RetryPolicy = RetryPolicy(),
        api_key: str | None = None,
        limits: httpx.Limits = DEFAULT_LIMITS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.client = InferenceClient(
            base_url, timeout=timeout, retry=retry, api_key=api_key, limits=limits, transport=transport
        )
        self.base_url, self.retry = self.client.base_url, retry
        self._loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self._loop.run_forever, name="inference-client", daemon=True)
        thread.start()
        # A client dropped without ``close`` (a one-off call) stops its thread when collected.
        self._stop = weakref.finalize(self, _stop_loop, self._loop, thread)

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()

    def __enter__(self) -> SyncInferenceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._stop.alive:
            self._run(self.client.aclose())
            self._stop()

    def complete(self, model: str, prompt: list[int] | str, **sampling: Any) -> Completion:
        """``InferenceClient.complete``, blocking."""
        return self._run(self.client.complete(model, prompt, **sampling))

    def load_lora(self, name: str, path: str) -> str:
        return self._run(self.client.load_lora(name, path))

    def unload_lora(self, name: str) -> str:
        return self._run(self.client.unload_lora(name))

    def reload_weights(self, path: str, version: int | None = None, *, pause: bool = True) -> list[Any]:
        return self._run(self.client.reload_weights(path, version, pause=pause))

    def served_version(self) -> int | None:
        return self._run(self.client.served_version())

    def pause(self) -> bool:
        return self._run(self.client.pause())

    def resume(self) -> None:
        self._run(self.client.resume())

    def reset_prefix_cache(self) -> None:
        self._run(self.client.reset_prefix_cache())

    def models(self) -> list[ModelCard]:
        return self._run(self.client.models())

    def health(self) -> bool:
        return self._run(self.client.health())

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        self._run(self.client.wait_ready(timeout_s))


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    if thread is not threading.current_thread():  # collected on its own thread: it stops after this callback
        thread.join()
        loop.close()
