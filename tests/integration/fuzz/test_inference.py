"""Fuzz every route of the inference server (the tiny model) from its OpenAPI schema.

The control routes (load/unload adapter, ``/collective_rpc``, ``/pause``, ``/resume``, ``/reset_prefix_cache``)
are fuzzed with the control token and without it. With the token, every request is either refused or
harmless: the weights folder is empty (no adapter or checkpoint to load), no adapter is loaded (nothing to
unload), ``/resume`` and ``/reset_prefix_cache`` leave the served model as it was, and ``/pause`` never gets
its one valid request (``mode=wait``), which would stop generation until a ``/resume``.
"""

from __future__ import annotations

import httpx
from hypothesis import strategies as st

from shared.protocol.inference import INFO_METHOD, RELOAD_METHOD
from tests.integration.fuzz.openapi import TOKEN, Target, fuzz_service, mostly, summary

TOKEN_IDS = mostly(st.lists(st.integers(0, 1023), min_size=1, max_size=12), st.lists(st.integers(-2, 1100), max_size=3))


def hints(root: str) -> dict[str, dict[str, st.SearchStrategy]]:
    """Values worth sending per route: mostly valid ones, so requests reach the engine and the weight checks;
    paths under, at and outside the (empty) weights root ``root``."""
    paths = st.sampled_from(
        ["", ".", "..", "/", "/etc", "v1", "\x00", root, f"{root}/v1", f"{root}/../x", f"{root}/a/../..", "x" * 300]
    )
    return {
        "POST /v1/completions": {
            "model": mostly(st.sampled_from([None, "policy"]), st.sampled_from(["policy-v1", ""])),
            "prompt": st.one_of(
                TOKEN_IDS, TOKEN_IDS, st.lists(TOKEN_IDS, min_size=1, max_size=3), st.text(max_size=40)
            ),
            "max_tokens": mostly(st.integers(1, 40), st.integers(-2, 300)),
            "n": mostly(st.integers(1, 3), st.integers(-1, 10)),
            "temperature": mostly(st.sampled_from([0.0, 1.0, 0.7]), st.sampled_from([-1.0, 1e-30, 1e30])),
            "top_p": mostly(st.sampled_from([1.0, 0.5]), st.sampled_from([1e-9, 0.0, 2.0])),
            "top_k": mostly(st.sampled_from([None, -1, 1, 5]), st.sampled_from([0, 2000, -5])),
            "logprobs": mostly(st.integers(0, 5) | st.none(), st.integers(-1, 30)),
            "stop": mostly(st.sampled_from([None, "a", ["a", "b"]]), st.sampled_from(["", [""], ["a"] * 50])),
            "seed": st.integers() | st.none(),
            "stop_token_ids": mostly(st.lists(st.integers(0, 1023), max_size=3), st.lists(st.integers(), max_size=3)),
            "min_tokens": mostly(st.integers(0, 8), st.sampled_from([-1, 10**9])),
            "ignore_eos": st.booleans(),
            "include_stop_str_in_output": st.booleans(),
            "skip_special_tokens": st.booleans(),
            "return_token_ids": st.booleans() | st.none(),
            "return_tokens_as_token_ids": st.booleans() | st.none(),
        },
        "POST /collective_rpc": {
            "method": st.sampled_from([RELOAD_METHOD, RELOAD_METHOD, INFO_METHOD, "", "shutdown"]),
            "args": st.lists(paths, max_size=2),
            "kwargs": st.dictionaries(
                st.sampled_from(["path", "weight_dir", "version"]), paths | st.sampled_from(["1", "-1", "x", "1e3"])
            ),
        },
        "POST /v1/load_lora_adapter": {"lora_name": st.sampled_from(["policy", "a", ""]), "lora_path": paths},
        "POST /v1/unload_lora_adapter": {"lora_name": st.sampled_from(["policy", "a", ""])},
        "POST /pause": {"mode": st.sampled_from(["wait", "abort", "keep", "WAIT"])},
    }


# Would pause the engine: never sent with the token (the fuzzer sends mode=abort, refused, instead).
FORBID = {"POST /pause": lambda params, body: params.get("mode") == "wait"}

CONTROL_ROUTES = {
    "POST /v1/load_lora_adapter",
    "POST /v1/unload_lora_adapter",
    "POST /collective_rpc",
    "POST /pause",
    "POST /resume",
    "POST /reset_prefix_cache",
}


def greedy(url: str) -> dict:
    body = {"model": "policy", "prompt": [5, 17, 33, 2], "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    body["return_token_ids"] = True
    reply = httpx.post(url + "/v1/completions", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]


def test_every_inference_route_survives_fuzzing(fuzz_inference, monkeypatch):
    url, app = fuzz_inference
    before = greedy(url)
    results = fuzz_service(Target(url, app, hints(str(app.state.server.root)), FORBID), monkeypatch)
    print(summary(results))
    assert {name.rsplit(" [", 1)[0] for name in results if name.endswith("[bad]")} == CONTROL_ROUTES
    # Still serving, and the same model: same greedy tokens, no adapter, version 0, not paused.
    after = greedy(url)
    assert after["token_ids"] == before["token_ids"] and len(after["token_ids"]) == 8
    assert [m["id"] for m in httpx.get(url + "/v1/models", timeout=10).json()["data"]] == ["policy"]
    assert httpx.get(url + "/is_paused", timeout=10).json() == {"is_paused": False}
    info = httpx.post(
        url + "/collective_rpc", json={"method": INFO_METHOD}, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    )
    assert info.json()["results"] == [{"weight_version": "0"}]
    assert httpx.get(url + "/health", timeout=10).status_code == 200
