"""Our server answers in vLLM's shapes: the same requests as the recorded vLLM fixtures give bodies with the
same fields, and the one client parses both the same way."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from shared.inference_client import Completion, error_message, parse_completion

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
OURS_ONLY = {"weight_version"}  # documented extra field of our server


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def keys(data: dict) -> set[str]:
    return set(data)


def same_kind(a: Completion, b: Completion) -> None:
    """Same client-visible structure: field types per choice, ids and logprobs aligned."""
    assert len(a.choices) == len(b.choices)
    for x, y in zip(a.choices, b.choices, strict=True):
        assert type(x.token_ids) is type(y.token_ids) and type(x.logprobs) is type(y.logprobs)
        assert len(x.token_ids) == len(x.logprobs) and len(y.token_ids) == len(y.logprobs)
        assert x.finish_reason in ("stop", "length") and y.finish_reason in ("stop", "length")


def _ours(server_url: str, request: dict) -> dict:
    request = {**request, "model": "policy", "prompt": [5, 17, 300, 42, 9]}
    response = httpx.post(f"{server_url}/v1/completions", json=request, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_completion_bodies_have_vllms_fields(server_url):
    for name in (
        "completion_stop_and_length.json",
        "completion_eos_and_stop_token.json",
        "completion_legacy_no_token_ids.json",
    ):
        data = fixture(name)
        ours = _ours(server_url, data["request"])
        theirs = data["response"]
        assert keys(ours) - OURS_ONLY <= keys(theirs) | {"system_fingerprint"}, name
        assert {"id", "object", "created", "model", "choices", "usage"} <= keys(ours) & keys(theirs)
        their_choice, our_choice = theirs["choices"][0], ours["choices"][0]
        required = {"index", "text", "logprobs", "finish_reason", "stop_reason"}
        assert required <= keys(our_choice) & keys(their_choice), name
        if "token_ids" in their_choice:
            assert our_choice["token_ids"] is not None and our_choice["prompt_token_ids"] is not None
        assert keys(our_choice["logprobs"]) == keys(their_choice["logprobs"])
        assert {"prompt_tokens", "completion_tokens", "total_tokens"} <= keys(ours["usage"])
        same_kind(parse_completion(ours), parse_completion(theirs))


def test_error_bodies_parse_the_same(server_url):
    ours = httpx.post(f"{server_url}/v1/completions", json={"model": "policy-v99", "prompt": [1]})
    theirs = fixture("errors.json")["cases"][0]
    assert ours.status_code == theirs["status"]
    assert error_message(ours) == theirs["message"]
    assert keys(ours.json()["error"]) <= keys(theirs["body"]["error"])


def test_models_and_admin_bodies(server_url, lora_dir_for_contract):
    theirs = fixture("models.json")["response"]
    ours = httpx.get(f"{server_url}/v1/models").json()
    assert keys(ours) == keys(theirs)
    assert keys(ours["data"][0]) == keys(theirs["data"][0])
    admin = fixture("admin.json")
    load = httpx.post(
        f"{server_url}/v1/load_lora_adapter", json={"lora_name": "contract", "lora_path": str(lora_dir_for_contract)}
    )
    assert load.status_code == 200 and load.text == admin["load_lora_adapter"]["text"].replace("policy-v3", "contract")
    card = next(c for c in httpx.get(f"{server_url}/v1/models").json()["data"] if c["id"] == "contract")
    assert keys(card) == keys(theirs["data"][1]) and card["parent"] == "policy"
    unload = httpx.post(f"{server_url}/v1/unload_lora_adapter", json={"lora_name": "contract"})
    assert unload.text == admin["unload_lora_adapter"]["text"].replace("policy-v3", "contract")


def _error_requests(lora_dir: Path) -> dict[str, list[tuple[str, str, dict]]]:
    """For each recorded vLLM error case, the requests that reproduce it here (the last one's answer counts)."""
    adapter = {"lora_name": "policy-v3", "lora_path": str(lora_dir)}
    return {
        "unknown model (current ErrorResponse shape)": [
            ("POST", "/v1/completions", {"model": "policy-v99", "prompt": [1], "max_tokens": 4})
        ],
        "negative max_tokens": [("POST", "/v1/completions", {"model": "policy", "prompt": [1], "max_tokens": -1})],
        "prompt longer than the context": [
            ("POST", "/v1/completions", {"model": "policy", "prompt": [1] * 520, "max_tokens": 4})
        ],
        "unload of an unknown adapter": [("POST", "/v1/unload_lora_adapter", {"lora_name": "policy-v1"})],
        "dev route HTTPException (collective_rpc without method)": [("POST", "/collective_rpc", {})],
        "LoRA already loaded": [("POST", "/v1/load_lora_adapter", adapter), ("POST", "/v1/load_lora_adapter", adapter)],
    }


def test_every_recorded_error_is_answered_alike(server_url, lora_dir_for_contract):
    """Same status, type, param and message as the recorded vLLM answer (context sizes aside)."""
    import re

    cases = {c["what"]: c for c in fixture("errors.json")["cases"]}
    plan = _error_requests(lora_dir_for_contract)
    current = [what for what in cases if "older" not in what]
    assert set(current) <= set(plan), f"recorded error cases without a replay here: {set(current) - set(plan)}"
    try:
        for what in current:
            for method, path, body in plan[what]:
                response = httpx.request(method, f"{server_url}{path}", json=body, timeout=30)
            theirs = cases[what]
            assert response.status_code == theirs["status"], (what, response.text)
            ours_error, their_error = response.json()["error"], theirs["body"]["error"]
            assert (ours_error["type"], ours_error["param"]) == (their_error["type"], their_error["param"]), what

            def shape(message: str) -> str:
                return re.sub(r"\d+", "N", message)

            assert shape(error_message(response)) == shape(theirs["message"]), what
    finally:
        httpx.post(f"{server_url}/v1/unload_lora_adapter", json={"lora_name": "policy-v3"}, timeout=30)
