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

One client, one wire: ``InferenceClient`` (async, httpx) is the surface; ``SyncInferenceClient`` (the trainer,
CLIs; ``shared.inference_sync``) runs its coroutines on a private event-loop thread and adds nothing; ``AiohttpCompletions`` is the
rollout's hot-path ``complete`` over aiohttp (measured side by side on this project's 2-core host against the
fake LLM, 64 requests in flight, httpx spent about 9 ms of CPU per request, its pool scanning every pooled
connection, and aiohttp about 0.8 ms: that decides how many episodes one rollout process keeps in flight,
``bench/rollout.py``). All three send ``completion_body`` (the one place the sampling arguments of
``complete`` and their defaults are written), parse with ``parse_completion``, raise ``InferenceError`` and
retry through ``shared.retry``'s one loop: 429, 502, 503, 504 and refused connections are sent again with
backoff; a 500 or another 4xx raises at once with the server's message; a timeout after the request went out
is not sent again (the server is still working on it; the caller decides). They send
``Authorization: Bearer`` with ``api_key``, or else with the stack's control token (``CODA_CONTROL_TOKEN``,
``shared.auth``) when one is configured: the weight routes require it.
"""

from __future__ import annotations

__all__ = [
    "COMPLETIONS",
    "AiohttpCompletions",
    "Completion",
    "GeneratedChoice",
    "InferenceClient",
    "InferenceError",
    "completion_body",
    "error_message",
    "message_of",
    "parse_completion",
]

import asyncio
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from shared.auth import bearer_headers
from shared.protocol.inference import (
    INFO_METHOD,
    RELOAD_METHOD,
    TOKEN_ID_PREFIX,
    CollectiveRpcResponse,
    CompletionChoice,
    CompletionResponse,
    ModelCard,
    ModelList,
)
from shared.retry import AnsweredError, RetryPolicy

if TYPE_CHECKING:  # aiohttp is the rollout's dependency only; the trainer imports this module without it
    import aiohttp

T = TypeVar("T")
DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=10.0)  # a long generation under load is not a failure
DEFAULT_LIMITS = httpx.Limits(max_connections=256, max_keepalive_connections=64)
COMPLETIONS = "/v1/completions"


class InferenceError(AnsweredError):
    """The server refused a request (4xx), failed it (500) or kept failing (``shared.retry``, after retries)."""

    service = "inference"


@dataclass(frozen=True)
class GeneratedChoice:
    """One completion: the ids the policy sampled, their logprobs, and why it stopped."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[float] | None  # per generated token; None when logprobs were not requested
    finish_reason: str | None  # "stop" (EOS, stop string or stop token) | "length" | "abort"
    stop_reason: int | str | None  # the stop string or stop token id; None for EOS and length


@dataclass(frozen=True)
class Completion:
    id: str
    model: str
    choices: list[GeneratedChoice]
    prompt_tokens: int
    completion_tokens: int
    weight_version: int | None  # our server reports it; vLLM does not (None)


def _token_id(token: str) -> int:
    if not token.startswith(TOKEN_ID_PREFIX):
        raise ValueError(
            f"logprob token {token!r} is not 'token_id:N'; send return_tokens_as_token_ids=true "
            "or return_token_ids=true"
        )
    return int(token[len(TOKEN_ID_PREFIX) :])


def parse_choice(choice: CompletionChoice) -> GeneratedChoice:
    """Generated ids and sampled logprobs of one choice, checked to line up."""
    lp = choice.logprobs
    if choice.token_ids is not None:
        token_ids = list(choice.token_ids)
    elif lp is not None:
        token_ids = [_token_id(t) for t in lp.tokens]
    else:
        raise ValueError("the response has neither token_ids nor logprobs; send return_token_ids=true")
    logprobs = None
    if lp is not None:
        if any(v is None for v in lp.token_logprobs):
            raise ValueError("a generated token has no logprob")
        logprobs = [float(v) for v in lp.token_logprobs]
        if len(logprobs) != len(token_ids):
            raise ValueError(f"{len(logprobs)} logprobs for {len(token_ids)} generated tokens")
    return GeneratedChoice(
        index=choice.index,
        text=choice.text,
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=choice.finish_reason,
        stop_reason=choice.stop_reason,
    )


def parse_completion(body: dict[str, Any]) -> Completion:
    """A ``/v1/completions`` JSON body (ours or vLLM's) as a ``Completion``."""
    response = CompletionResponse.model_validate(body)
    choices = [parse_choice(c) for c in sorted(response.choices, key=lambda c: c.index)]
    usage = response.usage
    return Completion(
        id=response.id,
        model=response.model,
        choices=choices,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens or sum(len(c.token_ids) for c in choices),
        weight_version=response.weight_version,
    )


def completion_body(
    model: str,
    prompt: list[int] | str,
    *,
    max_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop: list[str] | None = None,
    n: int = 1,
    seed: int | None = None,
    include_stop_str_in_output: bool = True,
    logprobs: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """The request body ``complete`` sends; ``extra`` passes any other vLLM field (e.g. ``cache_salt``).
    ``top_k``: keep the k most likely tokens, 0 = off (what vLLM and our server also take for 0)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "n": n,
        "stop": list(stop or []),
        "include_stop_str_in_output": include_stop_str_in_output,
        "skip_special_tokens": True,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    if seed is not None:
        body["seed"] = seed
    if logprobs:
        body["logprobs"] = 0  # the sampled token's logprob only
    body.update(extra)
    return body


def error_message(response: httpx.Response) -> str:
    """The human message of an error body in any of the shapes vLLM/FastAPI/we send."""
    return message_of(response.text, response.reason_phrase)


def message_of(text: str, fallback: str = "") -> str:
    """``error_message`` of a body already read as text (the aiohttp transport's)."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip() or fallback
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "message" in body:  # older vLLM: ErrorResponse fields at the top level
            return str(body["message"])
        if "detail" in body:  # FastAPI HTTPException (vLLM's dev routes)
            return str(body["detail"])
    return str(body)


def lora_body(name: str, path: str | None = None) -> dict[str, str]:
    return {"lora_name": name} if path is None else {"lora_name": name, "lora_path": str(path)}


def reload_body(path: str, version: int | None) -> dict[str, Any]:
    kwargs = {} if version is None else {"version": str(version)}
    return {"method": RELOAD_METHOD, "args": [str(path)], "kwargs": kwargs}


class InferenceClient:
    """Async, pooled client. One per process is plenty: it holds a connection pool. ``transport`` replaces
    the network (a replayed server in tests)."""

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
        headers = bearer_headers(api_key)  # None: the configured CODA_CONTROL_TOKEN, if any
        self.base_url = base_url.rstrip("/")
        self.retry = retry
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout, limits=limits, headers=headers, transport=transport
        )

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async def send() -> httpx.Response:
            response = await self._http.request(method, path, **kwargs)
            if not response.is_success:
                raise InferenceError(response.status_code, error_message(response))
            return response

        return await self.retry.acall(send, self.base_url + path)

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
        """The weight version the server has loaded: None from a server never sent weights (vLLM after a start),
        the version it started with from ours (0)."""
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


class AiohttpCompletions:
    """``complete(model, prompt_ids, **sampling) -> Completion`` over aiohttp, the subset of ``InferenceClient``
    agents use, for the rollout's hot path (the module docstring says why)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        retry: RetryPolicy = RetryPolicy(),
        max_connections: int = 1024,
    ) -> None:
        self.url = base_url.rstrip("/") + COMPLETIONS
        self.retry, self.timeout_s, self.max_connections = retry, timeout_s, max_connections
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        import aiohttp  # here: the rollout's dependency only

        # Created on first use: a session belongs to the event loop that is running then.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=10),
                headers=bearer_headers(),  # a vLLM with VLLM_API_KEY guards /v1/completions with the token
            )
        return self._session

    async def complete(self, model: str, prompt: list[int] | str, **sampling: Any) -> Completion:
        """``InferenceClient.complete`` over aiohttp: ``sampling`` takes ``completion_body``'s arguments."""
        body = completion_body(model, prompt, **sampling)

        async def send() -> Completion:
            async with self._client().post(self.url, json=body) as response:
                if response.status < 400:
                    return parse_completion(await response.json(content_type=None))
                raise InferenceError(response.status, message_of(await response.text(), response.reason or ""))

        return await self.retry.acall(send, self.url)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def _oldest_version(results: list[Any]) -> int | None:
    """The version in a ``coda_weight_info`` answer; None when any worker never loaded weights."""
    versions = [r.get("weight_version") for r in results if isinstance(r, dict)]
    # Several workers (tensor parallel) load together; the oldest one is what a request may meet.
    known = [int(v) for v in versions if v is not None]
    return min(known) if known and len(known) == len(versions) else None
