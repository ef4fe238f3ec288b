"""The agents' view of a language model: ``generate(prompt_ids, stop, max_tokens) -> Generation``.

A ``Generator`` is bound to one served model and one sampling setup. ``PolicyGenerator`` follows the
trained policy: every call reads the live ``PolicyState`` (version and model name, updated by the rollout's
weight-event follower), so a LoRA update switches requests to its adapter (``policy-<run>-v{N}``) and every generated token is
stamped with the version that sampled it. ``FrozenGenerator`` serves a fixed model (the searcher, the
recursive reasoner's worker): its tokens are never trained.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from shared.log import get_logger

if TYPE_CHECKING:  # aiohttp is needed only where the rollout builds that transport
    from agents.prompts import TokenizerLike
    from shared.inference_client import AiohttpCompletions, InferenceClient

log = get_logger(__name__)


@dataclass(frozen=True)
class Generation:
    """One sampled turn: the generated ids with their logprobs, exactly as the server reported them."""

    token_ids: list[int]
    logprobs: list[float]
    text: str  # as the server reported it: with a stop string, cut right after it (see ``whole_tokens``)
    finish_reason: str  # "stop" | "length" | "abort"
    stop_reason: int | str | None  # the stop string / stop token id; None for EOS and length
    version: int  # policy version that sampled every token (-1 for a frozen model)

    @property
    def hit_eos(self) -> bool:
        """The model ended the turn itself with EOS (not a stop string, not the token cap)."""
        return self.finish_reason == "stop" and self.stop_reason is None


def whole_tokens(gen: Generation, tok: TokenizerLike) -> Generation:
    """``gen`` with the text of its whole last token: text, ids and the parsed action then agree.

    With a byte-level BPE tokenizer the token that completes a stop string can run past it (SmolLM2 has
    ``>.`` and ``>,``: ``</task`` + ``>.``). vLLM (and our server) cut the text right after the stop string
    (``include_stop_str_in_output``) but keep that whole token in the ids, so the text would say ``</task>``
    while the ids (trained on, and fed to the next turn) say ``</task>.``. The ids are what was sampled and
    carry the logprobs, so they stay; the text gets the last token's characters after the stop string
    (found the way the server looks for it: the first match ending in that token). Parsers read the first
    complete action block and ignore what trails it.
    """
    stop = gen.stop_reason
    if not isinstance(stop, str) or not stop or not gen.token_ids:
        return gen
    text, before = tok.decode(gen.token_ids), tok.decode(gen.token_ids[:-1])
    start = text.find(stop, max(0, len(before) - len(stop) + 1))
    if start < 0:  # the decoded ids do not hold the stop string (a server that reported something else)
        raise ValueError(f"stop string {stop!r} not found where the last generated token ends: {text[-80:]!r}")
    tail = text[start + len(stop) :]
    if not tail:
        return gen
    head = gen.text if gen.text.endswith(stop) else gen.text + stop  # without include_stop_str_in_output
    return replace(gen, text=head + tail)


class Generator(Protocol):
    async def generate(self, prompt_ids: Sequence[int], *, stop: Sequence[str], max_tokens: int) -> Generation: ...


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off

    @classmethod
    def greedy(cls) -> Sampling:
        return cls(temperature=0.0, top_p=1.0)


@dataclass
class PolicyState:
    """The live policy: which version is served and under which model name (mutated by the weight follower);
    ``served_model_name``: the base model's name on the server (a full reload keeps serving under it)."""

    version: int = 0
    model_name: str = "policy"
    served_model_name: str = "policy"
    history: list[tuple[int, str]] = field(default_factory=list)

    def advance(self, version: int, model_name: str | None) -> bool:
        """Move to ``version`` (LoRA: serve ``model_name``; full reload: keep the base name). False if stale."""
        if version <= self.version and self.history:
            return False
        self.version = version
        self.model_name = model_name or self.served_model_name
        self.history.append((version, self.model_name))
        return True

    def live_version(self) -> int:
        """The version live now: what the fleet reads at every pick (``services.rollout.fleet.Fleet``)."""
        return self.version


class PolicyGenerator:
    """The trained policy behind an ``InferenceClient``; reads ``state`` at every call.

    A server that reports weights older than the version this call asks for restarted and lost them (an
    episode is given a server only once it serves the live version). Its tokens would be dropped as stale,
    so the call is repeated, for at most ``behind_wait_s``, while the rollout's fleet watch loads the weights
    again (it alone loads weights into servers; this only waits); then the tokens go out with the version
    that sampled them.
    """

    def __init__(
        self,
        client: InferenceClient | AiohttpCompletions,
        state: PolicyState,
        sampling: Sampling = Sampling(),
        behind_wait_s: float = 60.0,
        behind_retry_s: float = 0.5,
    ) -> None:
        self.client, self.state, self.sampling = client, state, sampling
        self.behind_wait_s, self.behind_retry_s = behind_wait_s, behind_retry_s
        self.behind = False  # the server was last seen serving older weights than the live version

    async def generate(self, prompt_ids: Sequence[int], *, stop: Sequence[str], max_tokens: int) -> Generation:
        deadline = time.monotonic() + self.behind_wait_s
        while True:
            version, model = self.state.version, self.state.model_name  # read once: one version per call
            out = await self.client.complete(
                model,
                list(prompt_ids),
                max_tokens=max_tokens,
                stop=list(stop),
                temperature=self.sampling.temperature,
                top_p=self.sampling.top_p,
                top_k=self.sampling.top_k,
            )
            # Our server reports the base-weight version it sampled with; after a full reload that is the truth
            # even if the reload landed while the request was queued. vLLM does not report it.
            if out.weight_version is None or model != self.state.served_model_name:
                return _generation(out.choices[0], version)
            if out.weight_version >= version or time.monotonic() >= deadline:
                if self.behind and out.weight_version >= version:
                    self.behind = False
                    log.info("the inference server serves the live weights again", extra={"version": version})
                return _generation(out.choices[0], out.weight_version)
            if not self.behind:
                self.behind = True
                log.warning(
                    "the inference server serves older weights than the live version (restarted?); "
                    "waiting for the rollout to load them again",
                    extra={"served": out.weight_version, "live": version},
                )
            await asyncio.sleep(self.behind_retry_s)


class FrozenGenerator:
    """A fixed served model (searcher, worker): tokens carry version -1 and are never trained."""

    def __init__(
        self, client: InferenceClient | AiohttpCompletions, model: str, sampling: Sampling = Sampling()
    ) -> None:
        self.client, self.model, self.sampling = client, model, sampling

    async def generate(self, prompt_ids: Sequence[int], *, stop: Sequence[str], max_tokens: int) -> Generation:
        out = await self.client.complete(
            self.model,
            list(prompt_ids),
            max_tokens=max_tokens,
            stop=list(stop),
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            top_k=self.sampling.top_k,
        )
        return _generation(out.choices[0], -1)


def _generation(choice, version: int) -> Generation:
    logprobs = choice.logprobs if choice.logprobs is not None else [0.0] * len(choice.token_ids)
    return Generation(
        token_ids=list(choice.token_ids),
        logprobs=list(logprobs),
        text=choice.text,
        finish_reason=choice.finish_reason or "stop",
        stop_reason=choice.stop_reason,
        version=version,
    )
