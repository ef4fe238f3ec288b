"""/v1/completions against a real tiny model: logprobs equal a plain transformers forward, vLLM semantics of
stop strings, EOS and length, seeds, batching under concurrency, and clear 4xx for bad input."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from shared.inference_client import InferenceClient, InferenceError
from tests.integration.inference.conftest import reference_logprobs

PROMPTS = [[5, 17, 300, 42, 9], [100, 200, 300], list(range(40, 90)), [7]]


def test_sampled_logprobs_equal_plain_forward(client, reference):
    """The trainer's importance-sampling correction relies on this: 1e-4 against transformers."""
    for i, prompt in enumerate(PROMPTS):
        out = client.complete("policy", prompt, max_tokens=24, temperature=1.0, n=3, seed=i, ignore_eos=True)
        assert len(out.choices) == 3
        for choice in out.choices:
            assert len(choice.token_ids) == 24 and choice.finish_reason == "length"
            ref = reference_logprobs(reference, prompt, choice.token_ids)
            assert max(abs(a - b) for a, b in zip(choice.logprobs, ref, strict=True)) < 1e-4


def test_greedy_matches_reference_argmax(client, reference):
    import torch

    prompt = PROMPTS[0]
    out = client.complete("policy", prompt, max_tokens=12, temperature=0.0, ignore_eos=True)
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(12):
            ids.append(int(reference(torch.tensor([ids])).logits[0, -1].argmax()))
    assert out.choices[0].token_ids == ids[len(prompt) :]


def test_seed_reproducible_and_choices_differ(client):
    a = client.complete("policy", PROMPTS[1], max_tokens=16, n=2, seed=123, ignore_eos=True)
    b = client.complete("policy", PROMPTS[1], max_tokens=16, n=2, seed=123, ignore_eos=True)
    assert [c.token_ids for c in a.choices] == [c.token_ids for c in b.choices]
    assert a.choices[0].token_ids != a.choices[1].token_ids


def test_stop_string_cuts_text_and_reports_stop_reason(client, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    base = client.complete("policy", PROMPTS[2], max_tokens=20, temperature=0.0, ignore_eos=True)
    text = base.choices[0].text
    stop = text[6:9]  # a string the greedy continuation is known to produce
    assert stop.strip(), text
    cut = client.complete(
        "policy",
        PROMPTS[2],
        max_tokens=20,
        temperature=0.0,
        ignore_eos=True,
        stop=[stop],
        include_stop_str_in_output=False,
    ).choices[0]
    kept = client.complete(
        "policy",
        PROMPTS[2],
        max_tokens=20,
        temperature=0.0,
        ignore_eos=True,
        stop=[stop],
        include_stop_str_in_output=True,
    ).choices[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == text[: text.index(stop)]
    assert kept.text == text[: text.index(stop) + len(stop)]
    # The token that completed the stop string is the last generated id; no token after it.
    assert cut.token_ids == base.choices[0].token_ids[: len(cut.token_ids)]
    assert stop in tok.decode(cut.token_ids) and stop not in tok.decode(cut.token_ids[:-1])


def test_stop_token_id_is_kept_and_reported(client):
    first = client.complete("policy", PROMPTS[0], max_tokens=3, temperature=0.0).choices[0].token_ids[0]
    by_id = client.complete("policy", PROMPTS[0], max_tokens=3, temperature=0.0, stop_token_ids=[first])
    choice = by_id.choices[0]
    assert choice.finish_reason == "stop" and choice.stop_reason == first and choice.token_ids == [first]
    # min_tokens holds the stop token back: generation continues past it
    held = client.complete(
        "policy", PROMPTS[0], max_tokens=3, temperature=0.0, stop_token_ids=[first], min_tokens=2
    ).choices[0]
    assert len(held.token_ids) >= 2 and held.token_ids[0] != first


def test_raw_response_shape_matches_vllm(server_url):
    body = {
        "model": "policy",
        "prompt": PROMPTS[0],
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }
    data = httpx.post(f"{server_url}/v1/completions", json=body, timeout=30).json()
    assert data["object"] == "text_completion" and data["id"].startswith("cmpl-")
    choice = data["choices"][0]
    lp = choice["logprobs"]
    assert all(t.startswith("token_id:") for t in lp["tokens"])
    assert [int(t.split(":")[1]) for t in lp["tokens"]] == choice["token_ids"]
    assert lp["text_offset"][0] == 0 and lp["text_offset"][1] == len(lp["tokens"][0])
    assert all(
        1 <= len(d) <= 2 and d[tok] == v
        for d, tok, v in zip(lp["top_logprobs"], lp["tokens"], lp["token_logprobs"], strict=True)
    )
    assert choice["prompt_token_ids"] == PROMPTS[0]
    assert data["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    assert isinstance(data["weight_version"], int)


def test_text_prompt(client):
    out = client.complete("policy", "Ed Wood is a film", max_tokens=5, temperature=0.0, ignore_eos=True)
    assert len(out.choices[0].token_ids) == 5 and out.prompt_tokens > 0


async def test_concurrent_requests_are_batched_and_correct(server_url, reference):
    async with InferenceClient(server_url) as llm:
        outs = await asyncio.gather(
            *[llm.complete("policy", PROMPTS[i % 4], max_tokens=16, seed=i, ignore_eos=True) for i in range(24)]
        )
    for i, out in enumerate(outs):
        ref = reference_logprobs(reference, PROMPTS[i % 4], out.choices[0].token_ids)
        assert max(abs(a - b) for a, b in zip(out.choices[0].logprobs, ref, strict=True)) < 1e-4
    metrics = httpx.get(f"{server_url}/metrics").text
    sizes = [line for line in metrics.splitlines() if line.startswith("coda_inference_batch_size_bucket")]
    assert any('le="1.0"' not in line and not line.endswith(" 0.0") for line in sizes)


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"model": "nope", "prompt": [1, 2]}, 404, "does not exist"),
        ({"model": "policy", "prompt": [1, 2], "max_tokens": -1}, 400, "max_tokens"),
        ({"model": "policy", "prompt": [1] * 600, "max_tokens": 4}, 400, "your prompt contains 600 input tokens"),
        ({"model": "policy", "prompt": [1] * 512, "max_tokens": 4}, 400, "max_tokens must be at least 1, got 0"),
        ({"model": "policy", "prompt": []}, 400, "non-empty"),
        ({"model": "policy", "prompt": [10**7]}, 400, "out of vocabulary"),
        ({"model": "policy", "prompt": [1], "top_p": 0}, 400, "top_p"),
        ({"model": "policy", "prompt": [1], "temperature": -1}, 400, "temperature"),
        ({"model": "policy", "prompt": [1], "n": 0}, 400, "n must be"),
        ({"model": "policy", "prompt": [1], "stream": True}, 400, "stream"),
        ({"model": "policy", "prompt": [1], "logprobs": 50}, 400, "logprobs"),
        ({"model": "policy", "prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
        ({"model": "policy", "prompt": [1], "repetition_penalty": 1.2}, 400, "not supported"),
        ({"model": "policy", "prompt": [1], "logit_bias": {"5": 10}}, 400, "not supported"),
    ],
)
def test_bad_input_is_a_clear_4xx(server_url, body, status, needle):
    response = httpx.post(f"{server_url}/v1/completions", json=body, timeout=30)
    assert response.status_code == status
    assert needle in response.json()["error"]["message"]


def test_max_tokens_past_the_context_is_capped_like_vllm(server_url):
    """vLLM (0.2x) caps max_tokens at the room the context leaves instead of refusing (recorded on vLLM 0.32)."""
    body = {"model": "policy", "prompt": [1] * 500, "max_tokens": 100, "ignore_eos": True, "return_token_ids": True}
    response = httpx.post(f"{server_url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert len(choice["token_ids"]) == 12 and choice["finish_reason"] == "length"


def test_error_names_the_parameter(server_url):
    body = {"model": "policy", "prompt": [1, 2], "max_tokens": -1}
    error = httpx.post(f"{server_url}/v1/completions", json=body, timeout=30).json()["error"]
    assert error["param"] == "max_tokens" and error["message"].endswith("(parameter=max_tokens, value=-1)")
    error = httpx.post(f"{server_url}/v1/completions", json={"model": "nope", "prompt": [1]}, timeout=30).json()[
        "error"
    ]
    assert error["param"] == "model" and error["message"] == "The model `nope` does not exist. Valid aliases: policy."


def test_client_raises_inference_error_without_retrying_4xx(client):
    with pytest.raises(InferenceError) as info:
        client.complete("nope", [1, 2], max_tokens=2)
    assert info.value.status_code == 404 and "does not exist" in info.value.message


def test_models_health_metrics(client, server_url):
    cards = client.models()
    assert cards[0].id == "policy" and cards[0].max_model_len == 512
    assert client.health()
    text = httpx.get(f"{server_url}/metrics").text
    for name in (
        "coda_inference_requests_total",
        "coda_inference_tokens_per_second",
        "coda_inference_loaded_adapters",
        "coda_inference_weight_version",
        "coda_inference_running_sequences 0.0",
        "coda_inference_waiting_requests 0.0",
        "coda_inference_generation_tokens_total",
        "coda_inference_step_seconds_bucket",
    ):
        assert name in text


def _prefix_hit_tokens(server_url: str) -> float:
    lines = httpx.get(f"{server_url}/metrics").text.splitlines()
    return float(
        next(line.split()[-1] for line in lines if line.startswith("coda_inference_prefix_cache_hit_tokens_total "))
    )


def test_multi_turn_prompts_reuse_cached_kv_with_exact_logprobs(client, reference, server_url):
    def hit_tokens() -> float:
        return _prefix_hit_tokens(server_url)

    prompt = [8, 9, 10, 11, 12, 13, 14]
    before = hit_tokens()
    turn1 = client.complete("policy", prompt, max_tokens=10, seed=5, ignore_eos=True).choices[0]
    history = prompt + turn1.token_ids + [40, 41, 42]  # the next turn: exact previous ids + an observation
    turn2 = client.complete("policy", history, max_tokens=10, seed=6, ignore_eos=True).choices[0]
    assert hit_tokens() - before >= len(prompt) + len(turn1.token_ids) - 1
    ref = reference_logprobs(reference, history, turn2.token_ids)
    assert max(abs(a - b) for a, b in zip(turn2.logprobs, ref, strict=True)) < 1e-4


def test_reset_prefix_cache_forgets_every_cached_prefix(client, reference, server_url):
    """After /reset_prefix_cache the next turn prefills its whole history (no hit), with the same logprobs."""
    prompt = [21, 22, 23, 24, 25, 26]
    turn1 = client.complete("policy", prompt, max_tokens=8, seed=7, ignore_eos=True).choices[0]
    history = prompt + turn1.token_ids + [50, 51]
    response = httpx.post(f"{server_url}/reset_prefix_cache")
    assert response.status_code == 200
    before = _prefix_hit_tokens(server_url)
    turn2 = client.complete("policy", history, max_tokens=8, seed=8, ignore_eos=True).choices[0]
    assert _prefix_hit_tokens(server_url) == before, "a prefix cached before the reset was reused"
    ref = reference_logprobs(reference, history, turn2.token_ids)
    assert max(abs(a - b) for a, b in zip(turn2.logprobs, ref, strict=True)) < 1e-4
    # The cache fills again afterwards: the same history once more reuses what turn 2 left.
    client.complete("policy", history + turn2.token_ids + [52], max_tokens=2, seed=9, ignore_eos=True)
    assert _prefix_hit_tokens(server_url) > before
