"""One client surface: the sampling arguments and their defaults live in ``completion_body`` only; the three
transports (async and sync httpx, the rollout's aiohttp) take them through and add none of their own; the sync
client is the async one's methods, run on its own loop thread."""

from __future__ import annotations

import asyncio
import gc
import inspect
import threading

import pytest

from shared.inference_client import AiohttpCompletions, InferenceClient, completion_body
from shared.inference_sync import SyncInferenceClient


@pytest.mark.parametrize("transport", [InferenceClient, SyncInferenceClient, AiohttpCompletions])
def test_transports_pass_the_sampling_arguments_through(transport):
    params = inspect.signature(transport.complete).parameters
    assert list(params) == ["self", "model", "prompt", "sampling"]
    assert params["sampling"].kind is inspect.Parameter.VAR_KEYWORD


def test_the_body_holds_the_defaults():
    body = completion_body("policy", [1, 2], max_tokens=4)
    assert body["temperature"] == 1.0 and body["top_p"] == 1.0 and body["top_k"] == 0 and body["n"] == 1
    assert body["stop"] == [] and body["logprobs"] == 0 and "seed" not in body
    assert completion_body("policy", [1], max_tokens=1, ignore_eos=True)["ignore_eos"] is True  # any vLLM field
    with pytest.raises(TypeError):
        completion_body("policy", [1])  # max_tokens is required, whichever transport sends it


def test_the_sync_client_has_the_async_clients_methods():
    skip = {"aclose"}
    for name, method in inspect.getmembers(InferenceClient, inspect.iscoroutinefunction):
        if name.startswith("_") or name in skip:
            continue
        sync = getattr(SyncInferenceClient, name)
        assert inspect.signature(sync).parameters == inspect.signature(method).parameters, name


def test_the_sync_client_runs_anywhere_and_leaves_no_thread():
    before = threading.active_count()
    for _ in range(3):
        assert SyncInferenceClient("http://127.0.0.1:1").health() is False  # dropped without close
    gc.collect()

    async def inside_a_running_loop() -> bool:
        with SyncInferenceClient("http://127.0.0.1:1") as llm:
            return llm.health()

    assert asyncio.run(inside_a_running_loop()) is False
    assert threading.active_count() == before
