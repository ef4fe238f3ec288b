"""One completion core: the sampling arguments and their defaults live in ``completion_body`` only; the three
transports (async and sync httpx, the rollout's aiohttp) take them through and add none of their own."""

from __future__ import annotations

import inspect

import pytest

from shared.inference_client import AiohttpCompletions, InferenceClient, SyncInferenceClient, completion_body


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
