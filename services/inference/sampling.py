"""Sampling parameters and the per-step sampler: temperature, top-k, top-p, seeds, logprobs.

Logprobs follow vLLM's ``--logprobs-mode``: ``raw_logprobs`` (vLLM's default) is ``log_softmax`` of the raw
logits, before temperature or truncation, i.e. exactly what a plain forward pass of the model gives, which is
what the trainer's importance-sampling correction compares against. ``processed_logprobs`` is the
distribution actually sampled from (after temperature, top-k, top-p and min_tokens masking).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]

# vLLM clamps -inf logprobs to this JSON-safe floor.
LOGPROB_FLOOR = -9999.0


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    min_tokens: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None  # None = no logprobs; k = sampled token + top k

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5


@dataclass
class StepResult:
    tokens: list[int]
    logprobs: list[float]
    top: list[dict[int, float] | None]  # top-k logprobs per row where asked for


def _truncate(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (−inf) tokens outside each row's top-k and nucleus; the most likely token always survives."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1]).unsqueeze(0)
    drop = (top_k.unsqueeze(1) > 0) & (ranks >= top_k.unsqueeze(1))
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # vLLM's rule: keep the smallest prefix whose mass reaches top_p (a token goes once the mass before it does)
    drop |= (mass_before >= top_p.unsqueeze(1)) & (top_p.unsqueeze(1) < 1.0)
    drop[:, 0] = False
    masked = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, masked)


def process_logits(logits: torch.Tensor, params: list[SamplingParams], banned: list[list[int]]) -> torch.Tensor:
    """The logits each row samples from: ``banned`` ids masked (min_tokens), temperature, top-k/top-p."""
    out = logits.clone()
    for row, ids in enumerate(banned):
        if ids:
            out[row, ids] = float("-inf")
    temps = torch.tensor([1.0 if p.greedy else p.temperature for p in params], dtype=out.dtype)
    out = out / temps.unsqueeze(1)
    top_k = torch.tensor([p.top_k if p.top_k > 0 else 0 for p in params])
    top_p = torch.tensor([p.top_p for p in params], dtype=out.dtype)
    if bool((top_k > 0).any()) or bool((top_p < 1.0).any()):
        out = _truncate(out, top_k, top_p)
    return out


def _gumbel(
    shape: torch.Size, generators: list[torch.Generator | None], default_generator: torch.Generator | None
) -> torch.Tensor:
    """Gumbel noise: argmax(logits + noise) is a sample of softmax(logits) (one batched draw, no multinomial).

    Rows with their own generator (seeded requests) draw from it, so their samples do not depend on what else
    is in the batch.
    """
    uniform = torch.empty(shape)
    shared = [row for row, gen in enumerate(generators) if gen is None]
    for row, gen in enumerate(generators):
        if gen is not None:
            uniform[row] = torch.rand(shape[-1], generator=gen)
    if shared:
        index = torch.tensor(shared)
        uniform[index] = torch.rand(len(shared), shape[-1], generator=default_generator)
    return -torch.log(-torch.log(uniform.clamp_(min=1e-20, max=1.0 - 1e-7)))


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    banned: list[list[int]],
    mode: LogprobsMode = "raw_logprobs",
    default_generator: torch.Generator | None = None,
) -> StepResult:
    """One token per row of ``logits`` ``[rows, vocab]`` (float32), with its logprob."""
    logits = logits.float()
    processed = process_logits(logits, params, banned)
    tokens = (processed + _gumbel(processed.shape, generators, default_generator)).argmax(dim=-1)
    greedy = torch.tensor([p.greedy for p in params])
    if bool(greedy.any()):
        tokens = torch.where(greedy, processed.argmax(dim=-1), tokens)
    source = logits if mode == "raw_logprobs" else processed
    logprobs = source.log_softmax(dim=-1)
    chosen = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1).clamp(min=LOGPROB_FLOOR)
    top: list[dict[int, float] | None] = []
    for row, p in enumerate(params):
        if p.logprobs:
            values, ids = logprobs[row].topk(min(p.logprobs, logprobs.shape[-1]))
            top.append({int(i): max(float(v), LOGPROB_FLOOR) for i, v in zip(ids, values, strict=True)})
        else:
            top.append(None)
    return StepResult(tokens=tokens.tolist(), logprobs=chosen.tolist(), top=top)
