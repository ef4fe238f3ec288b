"""After a publish: does the inference server compute the same logprobs as the trainer for the same weights?

The trainer does not load the weights it publishes (the rollout's fleet watch does): the check first waits
until the server serves the announced version (``wait_served``), then samples.

The server samples a short continuation of a fixed probe prompt with the published model name and returns
the sampled tokens' logprobs; the trainer scores the same tokens with its own weights. The largest absolute
difference is exported (``coda_trainer_sync_max_abs_diff``); with exact weight transfer on the same
hardware it stays below 1e-4. Every rank joins the scoring (ZeRO-3 gathers parameters collectively).
"""

from __future__ import annotations

import time

import torch

from services.trainer.engine import Engine
from services.trainer.logprobs import sequence_logprobs
from services.trainer.packing import TrainSeq, pack
from shared.inference_client import InferenceError
from shared.inference_sync import SyncInferenceClient
from shared.protocol import WeightUpdate

PROBE_QUESTION = "Who wrote Hamlet, and when was it first performed?"


def probe_prompt(model_dir: str, configured: list[int] | None = None) -> list[int]:
    """The probe's prompt ids: ``configured`` when set, else ``PROBE_QUESTION`` as the model's chat template
    renders it (plain text without a template). An ordinary prompt measures the transfer, not the kernels:
    after ids 1..8 (special tokens) the first sampled token's logprob differed between vLLM's CPU build and a
    plain forward by up to 2e-4 for the same weights, after a chat prompt by at most 7e-5 (SmolLM2, 5 adapters)."""
    if configured:
        return list(configured)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = PROBE_QUESTION
    if getattr(tok, "chat_template", None):
        messages = [{"role": "user", "content": PROBE_QUESTION}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tok.encode(text, add_special_tokens=False))


def serves(client: SyncInferenceClient, event: WeightUpdate) -> bool:
    """Whether the server serves ``event``'s weights: its adapter is listed (LoRA), or its full-weight version
    is at least ``event``'s (a server that cannot tell, e.g. vLLM without our worker extension, is taken to)."""
    if event.kind == "lora":
        return event.model_name in {card.id for card in client.models()}
    try:
        served = client.served_version()
    except InferenceError as exc:
        if exc.status_code >= 500:
            raise
        return True
    return served is not None and served >= event.version


def wait_served(client: SyncInferenceClient, event: WeightUpdate, timeout_s: float, poll_s: float = 0.5) -> bool:
    """Wait until the server serves ``event``'s weights (``serves``); False when it did not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not serves(client, event):
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def server_sample(
    client: SyncInferenceClient, model: str, prompt: list[int], max_tokens: int
) -> tuple[list[int], list[float]]:
    out = client.complete(model, prompt, max_tokens=max_tokens, temperature=1.0, seed=1234)
    choice = out.choices[0]
    return list(choice.token_ids), list(choice.logprobs or [])


def max_abs_diff(eng: Engine, prompt: list[int], tokens: list[int], server_logprobs: list[float]) -> float:
    """Largest |trainer − server| logprob over the sampled tokens (0.0 when none were sampled)."""
    if not tokens:
        return 0.0
    ids = prompt + tokens
    seq = TrainSeq(tokens=ids, mask=[0] * len(prompt) + [1] * len(tokens), index=0)
    was_training = eng.engine.training
    eng.engine.eval()
    try:
        ours = sequence_logprobs(eng.policy, pack([seq], len(ids)), eng.device)[0][len(prompt) :]
    finally:
        eng.engine.train(was_training)
    return float((torch.tensor(ours) - torch.tensor(server_logprobs)).abs().max())


def mismatch_warning(diff: float, tolerance: float, model: str) -> str | None:
    """What to tell the person when the server's logprobs are far from the trainer's (None when within)."""
    if diff <= tolerance:
        return None
    return (
        f"the inference server's logprobs for {model!r} differ from the trainer's by up to {diff:.3g} nats "
        f"(tolerance {tolerance:g}): it is not serving the weights the trainer has. Does the server run the "
        "trainer's base model (same folder or hub id, same dtype), and did the weight load reach it?"
    )
