"""The inference API's wire on the client side: request bodies, parsed completions and error messages, shared by
the three transports (``shared.inference_client``'s async and sync clients, ``recipes.core.aio_llm``) and the
scripted fake LLM. ``completion_body`` is the one place the sampling arguments of ``complete`` and their defaults
are written down; every transport's ``complete(model, prompt, **sampling)`` passes them through."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from shared.protocol.inference import (
    RELOAD_METHOD,
    TOKEN_ID_PREFIX,
    CompletionChoice,
    CompletionResponse,
)

COMPLETIONS = "/v1/completions"


class InferenceError(Exception):
    """The server refused a request (4xx), failed it (500) or kept failing (``shared.transient``, after retries)."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code, self.message = status_code, message


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


def raise_for(exc: httpx.HTTPStatusError) -> InferenceError:
    return InferenceError(exc.response.status_code, error_message(exc.response))


def lora_body(name: str, path: str | None = None) -> dict[str, str]:
    return {"lora_name": name} if path is None else {"lora_name": name, "lora_path": str(path)}


def reload_body(path: str, version: int | None) -> dict[str, Any]:
    kwargs = {} if version is None else {"version": str(version)}
    return {"method": RELOAD_METHOD, "args": [str(path)], "kwargs": kwargs}
