"""Loading weights into a policy server: the one place that does it (weights flow one way, docs/architecture.md, "The pipeline").

The trainer only writes ``policy-vN`` (served as ``<served>-<run>-vN``) and announces it on the ``weights`` stream; the rollout's fleet watch
(``services.rollout.fleet_watch``) alone brings every server up to the announced version, through
``load_update``. Tools that put weights on a server by hand (the stack's evals, the benchmarks, the vLLM
checks) call the same functions, so there is one way in and a test (``tests/unit/test_weights_owner.py``)
fails on any other.

LoRA: the adapter folder is loaded under its name (``POST /v1/load_lora_adapter``); full weights: the
safetensors folder replaces the served ones (``reload_weights``: pause, ``/collective_rpc``
``update_weights_from_path``, prefix-cache reset, resume). Both need the control token (``shared.auth``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

from shared.inference_client import InferenceClient, InferenceError
from shared.log import get_logger
from shared.protocol import WeightUpdate

log = get_logger(__name__)

LOAD_TIMEOUT_S = 300.0  # reading and checking a full checkpoint takes seconds to minutes


async def load_weights(
    client: InferenceClient, kind: Literal["lora", "full"], name: str, path: str | Path, version: int | None = None
) -> None:
    """Put the weights at ``path`` on ``client``'s server: a LoRA adapter served as ``name``, or full weights
    (served under the base name, reported as ``version``). ``path`` is the server's: sent as given."""
    where = str(path)
    if kind == "lora":
        await client.load_lora(name, where)
    else:
        await client.reload_weights(where, version)


async def load_update(client: InferenceClient, event: WeightUpdate) -> None:
    """Load the weights a ``WeightUpdate`` announced."""
    await load_weights(client, event.kind, event.model_name, event.path, event.version)


async def unload_adapter(client: InferenceClient, name: str) -> bool:
    """Unload adapter ``name``; False when the server refused (most often: it no longer held it, e.g. it
    restarted; nothing to free, and a freeing that matters is tried again with the next version)."""
    try:
        await client.unload_lora(name)
    except InferenceError as exc:
        log.info("adapter not unloaded", extra={"adapter": name, "reason": str(exc)[:200]})
        return False
    return True


def load_into(
    url: str,
    kind: Literal["lora", "full"],
    name: str,
    path: str | Path,
    version: int | None = None,
    *,
    timeout_s: float = LOAD_TIMEOUT_S,
) -> None:
    """``load_weights`` for blocking callers on the server's machine (the stack's evals, CLIs): ``path`` made
    absolute here; one client, one load, closed."""

    async def load() -> None:
        async with InferenceClient(url, timeout=timeout_s) as client:
            await load_weights(client, kind, name, Path(path).resolve(), version)

    asyncio.run(load())


def unload_from(url: str, name: str, *, timeout_s: float = LOAD_TIMEOUT_S) -> bool:
    """``unload_adapter`` for blocking callers."""

    async def unload() -> bool:
        async with InferenceClient(url, timeout=timeout_s) as client:
            return await unload_adapter(client, name)

    return asyncio.run(unload())
