"""What the engine works on: a ``Sequence`` (one choice being generated) and a ``GenerationRequest`` (all
choices of one HTTP request, completed together through a future), per-choice seeded generators, and the
per-sequence rules the engine applies after each token (masked ids, finish, final text)."""

from __future__ import annotations

import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from services.inference.sampling import SamplingParams
from services.inference.stops import Finish, check_text, check_token

if TYPE_CHECKING:
    from services.inference.model import ModelRunner


@dataclass
class Sequence:
    """One choice being generated."""

    prompt: list[int]
    params: SamplingParams
    adapter: str | None
    generator: torch.Generator | None
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)
    out_top: list[dict[int, float] | None] = field(default_factory=list)
    checked_text_len: int = 0
    text: str = ""
    finish: Finish | None = None


@dataclass
class GenerationRequest:
    """All choices of one HTTP request; the future resolves to ``(sequences, weight_version)``."""

    sequences: list[Sequence]
    future: Future = field(default_factory=Future)
    version: int | None = None
    arrived: float = field(default_factory=time.monotonic)  # bounds how long it waits on a paused engine

    @property
    def adapters(self) -> set[str]:
        return {s.adapter for s in self.sequences if s.adapter}


def resolve(future: Future, result: Any = None, error: BaseException | None = None) -> None:
    """Complete ``future`` unless it is already done (a cancel can race with completion; a failed request's
    remaining choices finish later)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


def make_generators(seed: int | None, count: int) -> list[torch.Generator | None]:
    """Per-choice generators: choice ``i`` of a seeded request samples with ``seed + i`` (reproducible)."""
    if seed is None:
        return [None] * count
    return [torch.Generator().manual_seed((seed + i) % (2**63)) for i in range(count)]


def banned_ids(seq: Sequence, eos_ids: frozenset[int]) -> list[int]:
    """Ids masked for the next token: EOS and stop ids until ``min_tokens`` exist."""
    if len(seq.out_ids) >= seq.params.min_tokens:
        return []
    eos = set() if seq.params.ignore_eos else set(eos_ids)
    return sorted(eos | seq.params.stop_token_ids)


def next_finish(seq: Sequence, token: int, runner: ModelRunner) -> Finish | None:
    """Whether ``token`` (just appended) ends ``seq``: stop id/EOS, stop string, max_tokens or a full context."""
    p, n = seq.params, len(seq.out_ids)
    finish = check_token(
        token,
        n,
        eos_ids=runner.eos_ids,
        stop_token_ids=p.stop_token_ids,
        ignore_eos=p.ignore_eos,
        min_tokens=p.min_tokens,
    )
    if finish is None and p.stop:
        text = runner.decode_text(seq.out_ids, p.skip_special_tokens)
        finish = check_text(text, seq.checked_text_len, p.stop, p.include_stop_str_in_output, n, p.min_tokens)
        seq.checked_text_len = len(text)
    if finish is None and (n >= p.max_tokens or len(seq.prompt) + n >= runner.max_model_len):
        finish = Finish("length")
    return finish


def final_text(seq: Sequence, runner: ModelRunner) -> str:
    p, finish = seq.params, seq.finish
    ids = seq.out_ids
    if finish is not None and isinstance(finish.stop_reason, int) and not p.include_stop_str_in_output:
        ids = ids[:-1]  # a stop token id is reported in stop_reason, not in the text
    text = runner.decode_text(ids, p.skip_special_tokens)
    if finish is not None and finish.text_end is not None:
        text = text[: finish.text_end]
    return text
