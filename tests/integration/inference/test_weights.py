"""Weight changes on a live server: after a LoRA load or a full reload the server's generations and logprobs
are exactly those of the new weights (checked against transformers/peft with a known perturbation);
unloading or reloading the original restores the base; in-flight requests finish on the weights they
started with and say which version that was."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from shared.inference_client import InferenceClient, InferenceError
from tests.integration.inference.conftest import max_diff, reference_logprobs

PROMPT = [5, 17, 300, 42, 9, 77]


def _greedy(model, prompt: list[int], steps: int) -> list[int]:
    import torch

    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_lora_load_changes_outputs_to_the_adapters_and_unload_restores(client, reference, lora_adapter):
    path, lora_model = lora_adapter
    before = client.complete("policy", PROMPT, max_tokens=16, seed=7, ignore_eos=True).choices[0]
    assert "added successfully" in client.load_lora("policy-v1", str(path))
    try:
        assert {c.id for c in client.models()} == {"policy", "policy-v1"}
        greedy = client.complete("policy-v1", PROMPT, max_tokens=12, temperature=0, ignore_eos=True).choices[0]
        assert greedy.token_ids == _greedy(lora_model, PROMPT, 12)
        sampled = client.complete("policy-v1", PROMPT, max_tokens=16, seed=7, ignore_eos=True).choices[0]
        assert max_diff(sampled.logprobs, reference_logprobs(lora_model, PROMPT, sampled.token_ids)) < 1e-4
        # the perturbation is real: the adapter scores the base's tokens differently
        assert max_diff(reference_logprobs(lora_model, PROMPT, before.token_ids), before.logprobs) > 1e-3
        base_again = client.complete("policy", PROMPT, max_tokens=16, seed=7, ignore_eos=True).choices[0]
        assert base_again.token_ids == before.token_ids
    finally:
        assert "removed successfully" in client.unload_lora("policy-v1")
    after = client.complete("policy", PROMPT, max_tokens=16, seed=7, ignore_eos=True).choices[0]
    assert after.token_ids == before.token_ids and max_diff(after.logprobs, before.logprobs) < 1e-5
    with pytest.raises(InferenceError) as info:
        client.complete("policy-v1", PROMPT, max_tokens=2)
    assert info.value.status_code == 404


async def test_base_and_adapter_rows_share_a_batch(server_url, client, reference, lora_adapter):
    path, lora_model = lora_adapter
    client.load_lora("mixed", str(path))
    try:
        async with InferenceClient(server_url) as llm:
            outs = await asyncio.gather(
                *[
                    llm.complete("mixed" if i % 2 else "policy", PROMPT, max_tokens=10, seed=i, ignore_eos=True)
                    for i in range(8)
                ]
            )
        for i, out in enumerate(outs):
            model = lora_model if i % 2 else reference
            ref = reference_logprobs(model, PROMPT, out.choices[0].token_ids)
            assert max_diff(out.choices[0].logprobs, ref) < 1e-4
    finally:
        client.unload_lora("mixed")


def test_lora_errors(client, lora_adapter, weights_root, tmp_path, tiny_model):
    path, _ = lora_adapter
    cases = [
        ({"lora_name": "x", "lora_path": str(tmp_path)}, 400, "outside the weights root"),
        ({"lora_name": "x", "lora_path": str(weights_root / "missing")}, 404, "does not exist"),
        ({"lora_name": "x", "lora_path": str(tiny_model)}, 400, "adapter_config.json"),
        ({"lora_name": "x", "lora_path": "/etc"}, 400, "outside the weights root"),
    ]
    for body, status, needle in cases:
        r = httpx.post(f"{client.base_url}/v1/load_lora_adapter", json=body, timeout=30)
        assert r.status_code == status and needle in r.json()["error"]["message"], (body, r.text)
    client.load_lora("a1", str(path))
    try:
        r = httpx.post(f"{client.base_url}/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(path)})
        assert r.status_code == 400 and "already been loaded" in r.text
        client.load_lora("a2", str(path))
        r = httpx.post(f"{client.base_url}/v1/load_lora_adapter", json={"lora_name": "a3", "lora_path": str(path)})
        assert r.status_code == 400 and "max_loras=2" in r.text
    finally:
        client.unload_lora("a1")
        client.unload_lora("a2")
    r = httpx.post(f"{client.base_url}/v1/unload_lora_adapter", json={"lora_name": "a1"})
    assert r.status_code == 404 and "cannot be found" in r.text


def test_full_reload_serves_exactly_the_new_weights_then_the_original(client, reference, perturbed, tiny_model):
    path, new_model = perturbed
    before = client.complete("policy", PROMPT, max_tokens=16, seed=9, ignore_eos=True)
    results = client.reload_weights(str(path), version=5)
    try:
        assert results[0]["weight_version"] == "5" and results[0]["tensors"] > 0
        out = client.complete("policy", PROMPT, max_tokens=16, seed=9, ignore_eos=True)
        assert out.weight_version == 5
        choice = out.choices[0]
        assert max_diff(choice.logprobs, reference_logprobs(new_model, PROMPT, choice.token_ids)) < 1e-4
        greedy = client.complete("policy", PROMPT, max_tokens=12, temperature=0, ignore_eos=True).choices[0]
        assert greedy.token_ids == _greedy(new_model, PROMPT, 12)
        assert (
            max_diff(reference_logprobs(new_model, PROMPT, before.choices[0].token_ids), before.choices[0].logprobs)
            > 1e-3
        )
    finally:
        client.reload_weights(str(tiny_model), version=6)
    after = client.complete("policy", PROMPT, max_tokens=16, seed=9, ignore_eos=True)
    assert after.weight_version == 6 and after.choices[0].token_ids == before.choices[0].token_ids
    assert max_diff(after.choices[0].logprobs, before.choices[0].logprobs) < 1e-5


async def test_reload_waits_for_in_flight_requests(server_url, client, reference, perturbed, tiny_model):
    path, new_model = perturbed
    async with InferenceClient(server_url) as llm:
        old_version = (await llm.complete("policy", PROMPT, max_tokens=1)).weight_version
        long = asyncio.create_task(llm.complete("policy", PROMPT, max_tokens=400, seed=1, ignore_eos=True))
        await asyncio.sleep(0.2)
        assert not long.done()  # still decoding when the reload arrives: the reload must wait for it
        reload = asyncio.create_task(llm.reload_weights(str(path), pause=False))  # the server's own drain
        old, results = await long, await reload
        new = await llm.complete("policy", PROMPT, max_tokens=8, seed=1, ignore_eos=True)
        await llm.reload_weights(str(tiny_model))
    assert old.weight_version == old_version and results[0]["weight_version"] == str(old_version + 1)
    assert max_diff(old.choices[0].logprobs, reference_logprobs(reference, PROMPT, old.choices[0].token_ids)) < 1e-4
    assert new.weight_version == old_version + 1
    assert max_diff(new.choices[0].logprobs, reference_logprobs(new_model, PROMPT, new.choices[0].token_ids)) < 1e-4


def test_reload_errors_change_nothing(client, weights_root, tmp_path, tiny_model):
    import torch
    from safetensors.torch import save_file

    version = client.complete("policy", PROMPT, max_tokens=1).weight_version
    bad = weights_root / "bad-shape"
    bad.mkdir(exist_ok=True)
    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, str(bad / "model.safetensors"))
    unknown = weights_root / "unknown-name"
    unknown.mkdir(exist_ok=True)
    save_file({"not.a.param": torch.zeros(3)}, str(unknown / "model.safetensors"))
    cases = [
        ({"method": "update_weights_from_path", "args": [str(tmp_path)]}, 400, "outside the weights root"),
        ({"method": "update_weights_from_path", "args": [str(weights_root / "nothing")]}, 404, "does not exist"),
        ({"method": "update_weights_from_path", "args": [str(bad)]}, 400, "shape"),
        ({"method": "update_weights_from_path", "args": [str(unknown)]}, 400, "does not have"),
        ({"method": "update_weights_from_path", "args": [str(Path(weights_root))]}, 400, "no .safetensors"),
        ({"method": "sleep", "args": []}, 400, "not available"),
        ({"method": "update_weights_from_path", "args": [1]}, 400, "args"),
    ]
    for body, status, needle in cases:
        r = httpx.post(f"{client.base_url}/collective_rpc", json=body, timeout=30)
        assert r.status_code == status and needle in r.json()["error"]["message"], (body, r.text)
    assert client.complete("policy", PROMPT, max_tokens=1).weight_version == version


async def test_pause_waits_for_in_flight_and_holds_new_requests_until_resume(server_url):
    async with InferenceClient(server_url) as llm:
        running = asyncio.create_task(llm.complete("policy", PROMPT, max_tokens=300, ignore_eos=True))
        await asyncio.sleep(0.1)
        assert await llm.pause()
        assert running.done()  # pause(mode=wait) returned only after the in-flight request finished
        held = asyncio.create_task(llm.complete("policy", PROMPT, max_tokens=2))
        await asyncio.sleep(0.3)
        assert not held.done()
        assert httpx.get(f"{server_url}/is_paused").json() == {"is_paused": True}
        await llm.resume()
        assert len((await held).choices[0].token_ids) == 2
    r = httpx.post(f"{server_url}/pause", params={"mode": "keep"})
    assert r.status_code == 400 and "mode=wait" in r.text
