"""The one client for policy inference: our CPU server and the real vLLM OpenAI server, same code.

Token-in/token-out: ``complete`` sends prompt token ids and gets back, per choice, the generated token ids,
the sampled tokens' logprobs, ``finish_reason`` and ``stop_reason`` exactly as vLLM reports them:

    async with InferenceClient("http://127.0.0.1:8002") as llm:
        out = await llm.complete("policy", prompt_ids, max_tokens=64, temperature=1.0, stop=["</search>"], n=4)
        for choice in out.choices:
            choice.token_ids, choice.logprobs, choice.finish_reason, choice.stop_reason

Generated ids come from vLLM's ``token_ids`` (``return_token_ids``); servers too old for that still give
them through ``return_tokens_as_token_ids`` ("token_id:N" strings), which we parse as the fallback.
Logprobs are those of the sampled tokens (``logprobs=0``). Weight management: ``load_lora``,
``unload_lora``, ``reload_weights`` (``/pause?mode=wait`` → ``POST /collective_rpc`` calling
``update_weights_from_path`` → ``/reset_prefix_cache`` → ``/resume``).

The sampling arguments of ``complete`` (``max_tokens``, ``temperature``, ``stop``, ``n``, ``seed``, ...) and
their defaults are those of ``completion_body``, the one request body every transport sends (this module's
two and the rollout's aiohttp one, ``recipes.core.aio_llm``). Transient failures (``shared.transient``: 429,
502, 503, 504, refused connections) are retried with backoff (``shared.retry``); a 500 or another 4xx raises
``InferenceError`` at once with the server's message. ``SyncInferenceClient`` is the same for the trainer and
CLIs. Both send ``Authorization: Bearer`` with ``api_key``, or else with the stack's control token
(``CODA_CONTROL_TOKEN``, ``shared.auth``) when one is configured: the weight routes require it.
"""

from __future__ import annotations

__all__ = [
    "Completion",
    "InferenceClient",
    "InferenceError",
    "SyncInferenceClient",
    "completion_body",
    "error_message",
    "parse_completion",
]

import asyncio
import time
from typing import Any

import httpx

from shared.auth import bearer_headers
from shared.inference_wire import (
    COMPLETIONS,
    Completion,
    InferenceError,
    completion_body,
    error_message,
    lora_body,
    parse_completion,
    raise_for,
    reload_body,
)
from shared.protocol.inference import (
    INFO_METHOD,
    CollectiveRpcResponse,
    ModelCard,
    ModelList,
)
from shared.retry import RetryPolicy, arequest, request

DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=10.0)  # a long generation under load is not a failure
DEFAULT_LIMITS = httpx.Limits(max_connections=256, max_keepalive_connections=64)


class InferenceClient:
    """Async, pooled client. One per process is plenty: it holds a connection pool."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        retry: RetryPolicy = RetryPolicy(),
        api_key: str | None = None,
        limits: httpx.Limits = DEFAULT_LIMITS,
    ) -> None:
        headers = bearer_headers(api_key)  # None: the configured CODA_CONTROL_TOKEN, if any
        self.base_url = base_url.rstrip("/")
        self.retry = retry
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, limits=limits, headers=headers)

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await arequest(self._http, method, path, policy=self.retry, **kwargs)
        except httpx.HTTPStatusError as exc:
            raise raise_for(exc) from None

    async def complete(self, model: str, prompt: list[int] | str, **sampling: Any) -> Completion:
        """Sample completions of one prompt (token ids, or text) with per-token logprobs; ``sampling`` takes
        ``completion_body``'s arguments (``max_tokens`` required)."""
        response = await self._call("POST", COMPLETIONS, json=completion_body(model, prompt, **sampling))
        return parse_completion(response.json())

    async def load_lora(self, name: str, path: str) -> str:
        return (await self._call("POST", "/v1/load_lora_adapter", json=lora_body(name, path))).text

    async def unload_lora(self, name: str) -> str:
        return (await self._call("POST", "/v1/unload_lora_adapter", json=lora_body(name))).text

    async def reload_weights(self, path: str, version: int | None = None, *, pause: bool = True) -> list[Any]:
        """Full-weight reload from a safetensors dir (vLLM: VLLM_SERVER_DEV_MODE=1 + our worker extension).

        With ``pause`` the server first finishes in-flight requests and admits no new ones
        (``/pause?mode=wait``), so no completion mixes two weight versions; then the RPC, a prefix-cache
        reset (old KV is stale) and ``/resume``. Servers without ``/pause`` reload without it.
        """
        paused = pause and await self.pause()
        try:
            response = await self._call("POST", "/collective_rpc", json=reload_body(path, version))
            await self.reset_prefix_cache()
        finally:
            if paused:
                await self.resume()
        return CollectiveRpcResponse.model_validate(response.json() if response.content else {}).results

    async def pause(self) -> bool:
        """``POST /pause?mode=wait``; False when the server has no such route (older vLLM)."""
        try:
            await self._call("POST", "/pause", params={"mode": "wait"})
        except InferenceError as exc:
            if exc.status_code in (404, 405):
                return False
            raise
        return True

    async def resume(self) -> None:
        await self._call("POST", "/resume")

    async def reset_prefix_cache(self) -> None:
        try:
            await self._call("POST", "/reset_prefix_cache")
        except InferenceError as exc:
            if exc.status_code not in (404, 405):
                raise

    async def models(self) -> list[ModelCard]:
        return ModelList.model_validate((await self._call("GET", "/v1/models")).json()).data

    async def served_version(self) -> int | None:
        """``SyncInferenceClient.served_version``, awaited (the rollout asks each server of its fleet)."""
        response = await self._call("POST", "/collective_rpc", json={"method": INFO_METHOD})
        return _oldest_version(CollectiveRpcResponse.model_validate(response.json()).results)

    async def health(self) -> bool:
        """One quick probe, no retries: True when the server answers 200."""
        try:
            return (await self._http.get("/health", timeout=5.0)).status_code == 200
        except httpx.HTTPError:
            return False

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not await self.health():
            if time.monotonic() > deadline:
                raise TimeoutError(f"inference server at {self.base_url} not healthy after {timeout_s:.0f}s")
            await asyncio.sleep(0.2)


class SyncInferenceClient:
    """Blocking twin of ``InferenceClient`` for the trainer and CLIs."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        retry: RetryPolicy = RetryPolicy(),
        api_key: str | None = None,
        limits: httpx.Limits = DEFAULT_LIMITS,
    ) -> None:
        headers = bearer_headers(api_key)  # None: the configured CODA_CONTROL_TOKEN, if any
        self.base_url = base_url.rstrip("/")
        self.retry = retry
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, limits=limits, headers=headers)

    def __enter__(self) -> SyncInferenceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return request(self._http, method, path, policy=self.retry, **kwargs)
        except httpx.HTTPStatusError as exc:
            raise raise_for(exc) from None

    def complete(self, model: str, prompt: list[int] | str, **sampling: Any) -> Completion:
        """``InferenceClient.complete``, blocking."""
        return parse_completion(self._call("POST", COMPLETIONS, json=completion_body(model, prompt, **sampling)).json())

    def load_lora(self, name: str, path: str) -> str:
        return self._call("POST", "/v1/load_lora_adapter", json=lora_body(name, path)).text

    def unload_lora(self, name: str) -> str:
        return self._call("POST", "/v1/unload_lora_adapter", json=lora_body(name)).text

    def reload_weights(self, path: str, version: int | None = None, *, pause: bool = True) -> list[Any]:
        paused = pause and self.pause()
        try:
            response = self._call("POST", "/collective_rpc", json=reload_body(path, version))
            self.reset_prefix_cache()
        finally:
            if paused:
                self.resume()
        return CollectiveRpcResponse.model_validate(response.json() if response.content else {}).results

    def served_version(self) -> int | None:
        """The weight version the server has loaded: None from a server never sent weights (vLLM after a start),
        the version it started with from ours (0)."""
        response = self._call("POST", "/collective_rpc", json={"method": INFO_METHOD})
        return _oldest_version(CollectiveRpcResponse.model_validate(response.json()).results)

    def pause(self) -> bool:
        try:
            self._call("POST", "/pause", params={"mode": "wait"})
        except InferenceError as exc:
            if exc.status_code in (404, 405):
                return False
            raise
        return True

    def resume(self) -> None:
        self._call("POST", "/resume")

    def reset_prefix_cache(self) -> None:
        try:
            self._call("POST", "/reset_prefix_cache")
        except InferenceError as exc:
            if exc.status_code not in (404, 405):
                raise

    def models(self) -> list[ModelCard]:
        return ModelList.model_validate(self._call("GET", "/v1/models").json()).data

    def health(self) -> bool:
        try:
            return self._http.get("/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.health():
            if time.monotonic() > deadline:
                raise TimeoutError(f"inference server at {self.base_url} not healthy after {timeout_s:.0f}s")
            time.sleep(0.2)


def _oldest_version(results: list[Any]) -> int | None:
    """The version in a ``coda_weight_info`` answer; None when any worker never loaded weights."""
    versions = [r.get("weight_version") for r in results if isinstance(r, dict)]
    # Several workers (tensor parallel) load together; the oldest one is what a request may meet.
    known = [int(v) for v in versions if v is not None]
    return min(known) if known and len(known) == len(versions) else None
