"""``/v1/completions`` semantics: validate a request as vLLM does, turn it into engine sequences, and build the
vLLM-shaped response (logprobs block, ``token_id:N`` strings, finish/stop reasons, usage).

Error messages follow vLLM's wording where it has one, so a client sees the same 4xx from both servers.
"""

from __future__ import annotations

import math

from services.inference.engine import GenerationRequest, Sequence, make_generators
from services.inference.model import ModelRunner
from services.inference.sampling import SamplingParams
from shared.http import ApiError
from shared.protocol.inference import (
    TOKEN_ID_PREFIX,
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
)

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


class RequestError(ApiError, ValueError):
    """A completion request vLLM would refuse: the route answers it as is (status, message, ``param``)."""


def invalid(param: str, value: object, message: str) -> RequestError:
    """A 400 worded like vLLM's validation errors: the message, then which parameter and value."""
    return RequestError(f"{message} (parameter={param}, value={value})", param=param)


def _num_prompts(prompt: list | str) -> int:
    return 1 if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int) else len(prompt)


def _check_text_length(text: str, runner: ModelRunner) -> None:
    """Refuse, before tokenising it, text that has more tokens than the context for sure: no token covers
    more than ``runner.max_token_chars`` characters. Tokenising 10 MB took 16 s and 2.5 GB."""
    limit = runner.max_model_len * runner.max_token_chars
    if len(text) > limit:
        raise invalid(
            "prompt",
            f"<{len(text)} characters>",
            f"This model's maximum context length is {runner.max_model_len} tokens. However, your "
            f"prompt has {len(text)} characters, more than {limit} ({runner.max_token_chars} per token "
            "at most in this vocabulary), which exceeds this limit even without any output tokens. "
            "Please reduce the length of the input prompt.",
        )


def _prompts(request: CompletionRequest, runner: ModelRunner) -> list[list[int]]:
    prompt = request.prompt
    texts = [prompt] if isinstance(prompt, str) else prompt if prompt and isinstance(prompt[0], str) else None
    if texts is not None:
        for text in texts:
            _check_text_length(text, runner)  # all of them before tokenising any
        prompts = [runner.encode(text) for text in texts]  # type: ignore[arg-type]
    elif prompt and isinstance(prompt[0], list):
        prompts = [list(p) for p in prompt]  # type: ignore[arg-type]
    else:
        prompts = [list(prompt)]  # type: ignore[arg-type]
    for ids in prompts:
        if not ids:
            raise RequestError("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
        bad = next((t for t in ids if not 0 <= t < runner.vocab_size), None)  # ints already (pydantic)
        if bad is not None:
            raise RequestError(f"Token id {bad} is out of vocabulary (vocab size {runner.vocab_size}).", param="prompt")
    return prompts


def _token_id(raw: object) -> int | None:
    """``raw`` as a token id: an int, or a decimal string (``logit_bias`` keys are strings in JSON)."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and len(raw) <= 20 and raw.strip().lstrip("-").isdecimal():
        return int(raw)
    return None


def _check_ids(param: str, ids: object, vocab: int) -> None:
    """Every id in ``ids`` (a list, or a dict's keys) is a token of the vocabulary: an id out of range indexes
    past the logits, and that once failed every request in the batch with it."""
    values = list(ids) if isinstance(ids, (list, dict)) else [ids]
    for raw in values:
        token = _token_id(raw)
        if token is None:
            raise RequestError(
                f"{param} holds {raw!r}, which is not a token id of this vocabulary (ids 0..{vocab - 1}).", param=param
            )
        if not 0 <= token < vocab:
            raise RequestError(f"Token id {token} in {param} is out of vocabulary (vocab size {vocab}).", param=param)


# Fields besides ``prompt`` that carry token ids (vLLM's names); checked when present, supported or not.
TOKEN_ID_FIELDS = ("stop_token_ids", "logit_bias", "allowed_token_ids", "logprob_token_ids")


def _check_token_id_fields(request: CompletionRequest, vocab: int) -> None:
    for name in TOKEN_ID_FIELDS:
        value = getattr(request, name, None) if name in type(request).model_fields else None
        value = value if value is not None else (request.model_extra or {}).get(name)
        if value is not None:
            _check_ids(name, value, vocab)


def _non_finite(value: object) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_non_finite(v) for v in value)
    return False


def _check_finite(request: CompletionRequest) -> None:
    """NaN and ±Infinity parse as JSON here (Python's json reads them); no sampling parameter may be one."""
    fields = {**{name: getattr(request, name) for name in type(request).model_fields}, **(request.model_extra or {})}
    for name, value in fields.items():
        if name != "prompt" and _non_finite(value):
            raise RequestError(f"{name} must be a finite number, got {value!r}.", param=name)


# vLLM fields this server does not implement, with their neutral values; anything else is refused (400) rather
# than silently ignored. Unknown fields that do not change sampling are ignored, as vLLM does.
UNSUPPORTED_NEUTRAL: dict[str, tuple] = {
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "logit_bias": (None, {}),
    "allowed_token_ids": (None, []),
    "bad_words": (None, []),
    "best_of": (None, 1),
    "use_beam_search": (None, False),
    "prompt_logprobs": (None,),
    "min_p": (None, 0, 0.0),
    "logprob_token_ids": (None,),
    "response_format": (None,),
    "structured_outputs": (None,),
    "suffix": (None,),
}


def _check_sampling(request: CompletionRequest, max_num_seqs: int, num_prompts: int) -> None:
    for name, value in (request.model_extra or {}).items():
        if name in UNSUPPORTED_NEUTRAL and value not in UNSUPPORTED_NEUTRAL[name]:
            raise RequestError(f"{name}={value!r} is not supported by this server (CPU stand-in for vLLM)")
    if request.stream:
        raise RequestError("stream=true is not supported by this server; send stream=false")
    if request.echo:
        raise RequestError("echo=true is not supported by this server")
    if request.n < 1:
        raise RequestError(f"n must be at least 1, got {request.n}.")
    if request.n * num_prompts > max_num_seqs:
        raise RequestError(
            f"{request.n * num_prompts} sequences requested; this server decodes at most "
            f"{max_num_seqs} at once (max_num_seqs)"
        )
    if request.temperature is not None and request.temperature < 0:
        raise RequestError(f"temperature must be non-negative, got {request.temperature}.")
    if request.top_p is not None and not 0 < request.top_p <= 1:
        raise RequestError(f"top_p must be in (0, 1], got {request.top_p}.")
    if request.logprobs is not None and not 0 <= request.logprobs <= MAX_LOGPROBS:
        raise RequestError(
            f"Requested sample logprobs of {request.logprobs}, which is greater than max allowed: {MAX_LOGPROBS}"
            if request.logprobs > 0
            else f"`logprobs` must be between 0 and {MAX_LOGPROBS}, got {request.logprobs}."
        )
    if request.min_tokens < 0:
        raise RequestError(f"min_tokens must be greater than or equal to 0, got {request.min_tokens}.")


def _max_tokens(request: CompletionRequest, prompt_len: int, max_model_len: int, default: int) -> int:
    """vLLM's rule (0.2x): a prompt longer than the context is refused; ``max_tokens`` is capped at the room the
    context leaves (the sequence then ends with ``finish_reason="length"``), and must come out at least 1."""
    if prompt_len > max_model_len:
        raise invalid(
            "input_tokens",
            prompt_len,
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{prompt_len} input tokens, which exceeds this limit even without any output tokens. "
            "Please reduce the length of the input prompt.",
        )
    max_tokens = request.max_tokens if request.max_tokens is not None else default
    max_tokens = min(max_tokens, max_model_len - prompt_len)
    if max_tokens < 1:
        raise invalid("max_tokens", max_tokens, f"max_tokens must be at least 1, got {max_tokens}.")
    return max_tokens


def build_request(
    request: CompletionRequest, runner: ModelRunner, adapter: str | None, *, max_num_seqs: int, default_max_tokens: int
) -> GenerationRequest:
    """Validated engine request: ``n`` sequences per prompt, prompt-major (vLLM's choice order).

    Cheap checks first, tokenising text last; the route runs this off the event loop (tokenising is CPU work).
    """
    _check_finite(request)
    _check_token_id_fields(request, runner.vocab_size)  # before the "not supported" refusals: ids are wrong
    _check_sampling(request, max_num_seqs, _num_prompts(request.prompt))
    prompts = _prompts(request, runner)
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    generators = make_generators(request.seed, request.n * len(prompts))
    sequences = []
    for ids in prompts:
        params = SamplingParams(
            max_tokens=_max_tokens(request, len(ids), runner.max_model_len, default_max_tokens),
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=request.top_k or 0,
            min_tokens=request.min_tokens,
            seed=request.seed,
            stop=stop,
            stop_token_ids=frozenset(request.stop_token_ids or ()),
            ignore_eos=request.ignore_eos,
            include_stop_str_in_output=request.include_stop_str_in_output,
            skip_special_tokens=request.skip_special_tokens,
            logprobs=request.logprobs,
        )
        for _ in range(request.n):
            sequences.append(Sequence(prompt=ids, params=params, adapter=adapter, generator=generators[len(sequences)]))
    return GenerationRequest(sequences)


def _token_str(runner: ModelRunner, token: int, as_id: bool) -> str:
    return f"{TOKEN_ID_PREFIX}{token}" if as_id else runner.tokenizer.decode([token])


def _logprobs_block(seq: Sequence, runner: ModelRunner, as_id: bool, k: int) -> CompletionLogProbs:
    """vLLM's legacy logprobs: sampled token first in each top dict, then the top ``k``; offsets by string."""
    tokens = [_token_str(runner, t, as_id) for t in seq.out_ids]
    offsets, offset = [], 0
    top_dicts: list[dict[str, float] | None] = []
    for text, logprob, top in zip(tokens, seq.out_logprobs, seq.out_top, strict=True):
        offsets.append(offset)
        offset += len(text)
        entry = {text: logprob}
        for other, value in (top or {}).items():
            if len(entry) > k:
                break
            entry.setdefault(_token_str(runner, other, as_id), value)
        top_dicts.append(entry)
    return CompletionLogProbs(
        text_offset=offsets, token_logprobs=list(seq.out_logprobs), tokens=tokens, top_logprobs=top_dicts
    )


def build_response(
    request: CompletionRequest, model_name: str, sequences: list[Sequence], version: int, runner: ModelRunner
) -> CompletionResponse:
    choices = []
    prompt_tokens, seen_prompts = 0, 0
    for index, seq in enumerate(sequences):
        if index % request.n == 0:
            prompt_tokens += len(seq.prompt)
            seen_prompts += 1
        logprobs = None
        if request.logprobs is not None:
            logprobs = _logprobs_block(seq, runner, bool(request.return_tokens_as_token_ids), request.logprobs)
        finish = seq.finish
        choices.append(
            CompletionChoice(
                index=index,
                text=seq.text,
                logprobs=logprobs,
                finish_reason=finish.reason if finish else None,
                stop_reason=finish.stop_reason if finish else None,
                token_ids=list(seq.out_ids) if request.return_token_ids else None,
                prompt_token_ids=list(seq.prompt) if request.return_token_ids else None,
            )
        )
    completion_tokens = sum(len(s.out_ids) for s in sequences)
    usage = UsageInfo(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
    )
    return CompletionResponse(model=model_name, choices=choices, usage=usage, weight_version=version)
