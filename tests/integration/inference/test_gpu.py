"""On a CUDA host our inference server runs the model on the GPU: the same HTTP server, its KV buffers and prefix
cache on the device, sampling on the CPU. In fp32 its logprobs equal the CPU reference's (tolerance for the
GPU's own reduction order), with and without a LoRA adapter, in mixed batches; with bf16 weights (what
``precision = auto`` picks there) greedy decoding still follows the reference for the first tokens."""

from __future__ import annotations

import asyncio

import pytest

from shared.inference_client import InferenceClient
from shared.inference_sync import SyncInferenceClient
from tests.integration.inference.conftest import max_diff, reference_logprobs, server_settings

pytestmark = pytest.mark.gpu

PROMPTS = [[11, 22, 33, 44, 55], [7, 8, 9], [101, 102, 103, 104, 105, 106, 107, 108, 109]]


def serve(tiny_model, weights_root, precision: str):
    from testing.local_inference import serve_in_thread

    return serve_in_thread(server_settings(tiny_model, weights_root, device="cuda", precision=precision))


def test_fp32_on_the_gpu_matches_the_cpu_reference_with_and_without_lora(
    tiny_model, weights_root, reference, lora_adapter
):
    path, lora_model = lora_adapter
    with serve(tiny_model, weights_root, "fp32") as url, SyncInferenceClient(url) as client:
        assert client.health()
        client.load_lora("gpu-lora", str(path))

        async def batch():
            async with InferenceClient(url) as llm:
                return await asyncio.gather(
                    *[
                        llm.complete("gpu-lora" if i % 2 else "policy", prompt, max_tokens=12, seed=i, ignore_eos=True)
                        for i, prompt in enumerate(PROMPTS * 2)
                    ]
                )

        outs = asyncio.run(batch())
    for i, (out, prompt) in enumerate(zip(outs, PROMPTS * 2, strict=True)):
        model = lora_model if i % 2 else reference
        choice = out.choices[0]
        assert len(choice.token_ids) == 12
        assert max_diff(choice.logprobs, reference_logprobs(model, prompt, choice.token_ids)) < 2e-3


def test_bf16_on_the_gpu_decodes_like_the_reference(tiny_model, weights_root, reference):
    with serve(tiny_model, weights_root, "auto") as url, SyncInferenceClient(url) as client:
        out = client.complete("policy", PROMPTS[0], max_tokens=8, temperature=0, ignore_eos=True).choices[0]
    ref = reference_logprobs(reference, PROMPTS[0], out.token_ids)
    # bf16 weights carry ~3 significant digits: close to the fp32 reference, not equal to it.
    assert max_diff(out.logprobs, ref) < 0.1
