"""The one inference client against recorded vLLM shapes: parsing, errors, and the HTTP calls it makes.

vLLM cannot run here, so its side is replayed from ``tests/fixtures/vllm`` through ``httpx.MockTransport``;
``tests/integration/inference/test_contract.py`` checks that our server answers in the same shapes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from shared.inference_client import (
    InferenceClient,
    InferenceError,
    completion_body,
    error_message,
    parse_completion,
)
from shared.inference_sync import SyncInferenceClient
from shared.protocol.inference import CompletionRequest, ModelList
from shared.retry import RetryPolicy

# CODA_VLLM_FIXTURES: run this module over bodies deploy/vllm/record_fixtures.py has just captured.
FIXTURES = Path(os.environ.get("CODA_VLLM_FIXTURES") or Path(__file__).resolve().parents[2] / "fixtures" / "vllm")
NO_WAIT = RetryPolicy(attempts=3, backoff_s=0.0, jitter=0.0)


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def test_stop_string_and_length_choices():
    data = fixture("completion_stop_and_length.json")
    out = parse_completion(data["response"])
    first, second = out.choices
    stop = data["request"]["stop"][0]
    assert first.finish_reason == "stop" and first.stop_reason == stop
    assert first.text.endswith(stop)  # include_stop_str_in_output was true
    assert first.token_ids == data["response"]["choices"][0]["token_ids"]
    assert first.logprobs == data["response"]["choices"][0]["logprobs"]["token_logprobs"]
    assert second.finish_reason == "length" and second.stop_reason is None
    assert len(second.token_ids) == data["request"]["max_tokens"]
    assert out.prompt_tokens == len(data["request"]["prompt"])
    assert out.weight_version == data["response"].get("weight_version")  # vLLM: absent → None
    assert out.completion_tokens == len(first.token_ids) + len(second.token_ids)


def test_eos_keeps_the_id_and_stop_token_reports_it():
    data = fixture("completion_eos_and_stop_token.json")
    out = parse_completion(data["response"])
    eos, stop = out.choices
    stop_id = data["request"]["stop_token_ids"][0]
    # EOS ends the choice with stop_reason null and stays the last id (vLLM keeps it in token_ids, not the text)
    assert eos.finish_reason == "stop" and eos.stop_reason is None and eos.token_ids[-1] != stop_id
    assert stop.stop_reason == stop_id and stop.token_ids[-1] == stop_id


def test_legacy_server_ids_come_from_token_id_strings():
    data = fixture("completion_legacy_no_token_ids.json")
    choice = parse_completion(data["response"]).choices[0]
    assert choice.token_ids == [2132, 374, 264, 4532]
    assert choice.logprobs == [-1.5, -0.2, -0.9, -2.2]


def test_request_fixtures_validate_against_our_request_model():
    for name in (
        "completion_stop_and_length.json",
        "completion_eos_and_stop_token.json",
        "completion_legacy_no_token_ids.json",
    ):
        CompletionRequest.model_validate(fixture(name)["request"])


def test_client_body_has_the_fields_vllm_needs_for_token_in_token_out():
    body = completion_body("policy", [1, 2], max_tokens=8, stop=["</search>"], n=2, seed=3)
    assert body["return_token_ids"] and body["return_tokens_as_token_ids"] and body["logprobs"] == 0
    assert body["prompt"] == [1, 2] and body["seed"] == 3 and body["stop"] == ["</search>"]
    assert set(body) <= set(CompletionRequest.model_fields)


def test_mismatched_logprobs_are_refused():
    bad = fixture("completion_stop_and_length.json")["response"]
    bad["choices"][0]["logprobs"]["token_logprobs"].pop()
    with pytest.raises(ValueError, match="logprobs for"):
        parse_completion(bad)


@pytest.mark.parametrize("case", fixture("errors.json")["cases"], ids=lambda c: c["what"])
def test_error_messages_in_every_vllm_shape(case):
    response = httpx.Response(case["status"], json=case["body"])
    assert error_message(response) == case["message"]


def test_models_fixture_parses():
    cards = ModelList.model_validate(fixture("models.json")["response"]).data
    assert [c.id for c in cards] == ["policy", "policy-v3"] and cards[1].parent == "policy"


def _replay(calls: list[httpx.Request], routes: dict[str, httpx.Response]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return routes.get(request.url.path, httpx.Response(404, json={"detail": "Not Found"}))

    return httpx.MockTransport(handler)


def _client(transport: httpx.MockTransport) -> SyncInferenceClient:
    return SyncInferenceClient("http://vllm", retry=NO_WAIT, transport=transport)


def test_sync_client_against_replayed_vllm():
    admin = fixture("admin.json")
    calls: list[httpx.Request] = []
    routes = {
        "/v1/completions": httpx.Response(200, json=fixture("completion_stop_and_length.json")["response"]),
        "/v1/models": httpx.Response(200, json=fixture("models.json")["response"]),
        "/v1/load_lora_adapter": httpx.Response(200, text=admin["load_lora_adapter"]["text"]),
        "/v1/unload_lora_adapter": httpx.Response(200, text=admin["unload_lora_adapter"]["text"]),
        "/collective_rpc": httpx.Response(200, json=admin["collective_rpc"]["response"]),
        "/pause": httpx.Response(200, json=admin["pause"]["response"]),
        "/resume": httpx.Response(200, json=admin["resume"]["response"]),
        "/reset_prefix_cache": httpx.Response(200),
    }
    client = _client(_replay(calls, routes))
    stop = fixture("completion_stop_and_length.json")["request"]["stop"]
    out = client.complete("policy-v3", [1, 2, 3], max_tokens=19, n=2, stop=stop)
    assert out.choices[0].stop_reason == stop[0]
    load, rpc = admin["load_lora_adapter"]["request"], admin["collective_rpc"]["request"]
    assert "added successfully" in client.load_lora(load["lora_name"], load["lora_path"])
    assert "removed successfully" in client.unload_lora("policy-v3")
    results = client.reload_weights(rpc["args"][0], version=int(rpc["kwargs"]["version"]))
    assert results[0]["weight_version"] == rpc["kwargs"]["version"]  # strings only through collective_rpc
    assert [c.id for c in client.models()] == ["policy", "policy-v3"]
    paths = [(r.method, r.url.path) for r in calls]
    assert paths[3:7] == [
        ("POST", "/pause"),
        ("POST", "/collective_rpc"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/resume"),
    ]
    assert calls[3].url.params["mode"] == "wait"
    assert json.loads(calls[4].content) == admin["collective_rpc"]["request"]
    assert json.loads(calls[1].content) == admin["load_lora_adapter"]["request"]


def test_reload_without_pause_route_still_reloads_and_4xx_is_not_retried():
    admin = fixture("admin.json")
    calls: list[httpx.Request] = []
    routes = {
        "/collective_rpc": httpx.Response(200, json=admin["collective_rpc"]["response"]),
        "/v1/completions": httpx.Response(404, json=fixture("errors.json")["cases"][0]["body"]),
    }
    client = _client(_replay(calls, routes))
    results = client.reload_weights("/weights/full/v7")
    assert results == admin["collective_rpc"]["response"]["results"]
    assert [r.url.path for r in calls] == ["/pause", "/collective_rpc", "/reset_prefix_cache"]
    calls.clear()
    with pytest.raises(InferenceError) as info:
        client.complete("policy-v99", [1], max_tokens=1)
    assert info.value.status_code == 404 and "does not exist" in info.value.message and len(calls) == 1


async def test_async_client_retries_5xx_then_succeeds():
    body = fixture("completion_eos_and_stop_token.json")["response"]
    replies = iter(
        [
            httpx.Response(503, json={"error": {"message": "busy", "type": "x", "code": 503}}),
            httpx.Response(200, json=body),
        ]
    )
    client = InferenceClient("http://vllm", retry=NO_WAIT, transport=httpx.MockTransport(lambda r: next(replies)))
    async with client:
        out = await client.complete("policy", [1], max_tokens=4, n=2)
    assert out.choices[1].stop_reason == body["choices"][1]["stop_reason"] is not None
