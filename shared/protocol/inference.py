"""The subset of vLLM's OpenAI-compatible API the stack uses, with vLLM's own field names and shapes.

Source of the shapes: vLLM ``entrypoints/openai/completion/protocol.py`` (``CompletionRequest``,
``CompletionLogProbs``, ``CompletionResponseChoice``, ``CompletionResponse``), ``engine/protocol.py``
(``UsageInfo``, ``ModelCard``, ``ModelList``, ``ErrorResponse``), ``serve/lora/protocol.py``
(``LoadLoRAAdapterRequest``, ``UnloadLoRAAdapterRequest``) and ``serve/dev/rpc/api_router.py``
(``POST /collective_rpc``). Our CPU server (``services/inference``) answers with these models; the client
(``shared/inference_client.py``) parses real vLLM responses with the same ones.

Response models allow extra fields: a newer vLLM adds fields (``metrics``, ``routed_experts``, …) and the
client must keep working. The one field of ours beyond vLLM's is ``weight_version`` on
``CompletionResponse`` (the base-weight version that produced every token of the response; vLLM leaves it
out, so it is optional).
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The worker-extension method the trainer calls through ``POST /collective_rpc`` for a full-weight reload;
# ``shared/vllm_worker_extension.py`` implements it inside vLLM, our CPU server implements it natively.
RELOAD_METHOD = "update_weights_from_path"
# The method that asks which weight version is loaded (None from vLLM before its first reload): the trainer
# polls it to notice a server that restarted and lost the published weights.
INFO_METHOD = "coda_weight_info"

# A prompt list is refused at its first bad item, not with an error per item: a 2 MB list of floats took
# seconds to validate and made a 100 MB error.
_TokenIds = Annotated[list[int], Field(fail_fast=True)]

# vLLM's prefix for token strings when ``return_tokens_as_token_ids`` is set: "token_id:123".
TOKEN_ID_PREFIX = "token_id:"


class _Lenient(BaseModel):
    """Response side: unknown fields from a newer vLLM are kept, never an error."""

    model_config = ConfigDict(extra="allow")


class CompletionRequest(BaseModel):
    """``POST /v1/completions`` body (the fields we use; vLLM accepts and ignores others, so do we)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(None, description="Served model or LoRA adapter name; None = the base model")
    prompt: (
        _TokenIds
        | Annotated[list[_TokenIds], Field(fail_fast=True)]
        | str
        | Annotated[list[str], Field(fail_fast=True)]
    ) = Field(description="Token ids (preferred: token-in/token-out), a batch of them, or text")
    max_tokens: int | None = Field(16, description="Tokens to generate at most (vLLM default 16)")
    n: int = Field(1, description="Completions per prompt")
    temperature: float | None = Field(None, description="Sampling temperature; 0 = greedy (default 1.0)")
    top_p: float | None = Field(None, description="Nucleus sampling mass in (0, 1] (default 1.0)")
    top_k: int | None = Field(None, description="Keep the k most likely tokens; 0 or -1 = off")
    seed: int | None = Field(None, description="Per-request sampling seed (reproducible sampling)")
    stop: str | list[str] | None = Field(None, description="Stop strings; the turn ends when text contains one")
    stop_token_ids: list[int] | None = Field(None, description="Token ids that end the completion")
    include_stop_str_in_output: bool = Field(False, description="Keep the matched stop string in text")
    ignore_eos: bool = Field(False, description="Do not stop at the EOS token")
    min_tokens: int = Field(0, description="Generate at least this many tokens before EOS/stop can end it")
    logprobs: int | None = Field(None, description="Return the sampled token's logprob (+ this many top ones)")
    return_tokens_as_token_ids: bool | None = Field(None, description="Logprob tokens as 'token_id:N'")
    return_token_ids: bool | None = Field(None, description="Add prompt_token_ids and token_ids to choices")
    skip_special_tokens: bool = Field(True, description="Leave special tokens (pad/eos) out of the text")
    echo: bool | None = Field(False, description="Echo the prompt (not supported by our CPU server)")
    stream: bool | None = Field(False, description="Server-sent events (not supported by our CPU server)")
    cache_salt: str | None = Field(None, description="Prefix-cache salt, e.g. the policy version")
    user: str | None = None


class CompletionLogProbs(_Lenient):
    """OpenAI legacy logprobs block: parallel lists over the generated tokens."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] | None = Field(default_factory=list)


class CompletionChoice(_Lenient):
    """One completion. ``stop_reason``: the stop string or stop token id; None for EOS or length."""

    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[Any] | None = None


class UsageInfo(_Lenient):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0


class CompletionResponse(_Lenient):
    id: str = Field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None
    # Ours (not in vLLM): the base-weight version every token of this response was sampled with.
    weight_version: int | None = None


class ModelCard(_Lenient):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "vllm"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[dict[str, Any]] = Field(default_factory=list)


class ModelList(_Lenient):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


class LoadLoRAAdapterRequest(BaseModel):
    """``POST /v1/load_lora_adapter``; vLLM answers 200 with a plain-text success line."""

    model_config = ConfigDict(extra="allow")

    lora_name: str = Field(description="Name requests use in ``model`` to select the adapter")
    lora_path: str = Field(description="PEFT adapter directory (adapter_config.json + weights)")
    load_inplace: bool = Field(False, description="Replace an adapter of the same name (vLLM ≥ 0.14)")


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    lora_name: str
    lora_int_id: int | None = None


class CollectiveRpcRequest(BaseModel):
    """vLLM dev-mode ``POST /collective_rpc``: only string args/kwargs travel (vLLM's own rule)."""

    model_config = ConfigDict(extra="forbid")

    # Optional here so that a body without it gets vLLM's own 400 ("Missing 'method' in request body").
    method: str | None = Field(None, description="Worker method name, e.g. update_weights_from_path")
    args: list[str] = Field(default_factory=list)
    kwargs: dict[str, str] = Field(default_factory=dict)
    timeout: float | None = None


class CollectiveRpcResponse(_Lenient):
    """One result per worker (vLLM stringifies results that are not dicts or lists)."""

    results: list[Any] = Field(default_factory=list)


class ErrorInfo(_Lenient):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(_Lenient):
    """vLLM's current error body ``{"error": {...}}`` (older versions sent the fields at the top level)."""

    error: ErrorInfo
