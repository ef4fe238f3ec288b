"""Nobody else can drive the policy server: each weight and control route, sent a valid request without the
control token (or with a wrong one), answers 401 and loads nothing; with the token it does its work. The real
server app (tiny model) is started in-process with a client address that is not loopback."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from services.inference.app import create_inference_app
from shared.auth import CONTROL_TOKEN_ENV
from shared.inference_client import InferenceError
from shared.inference_sync import SyncInferenceClient
from shared.protocol.inference import INFO_METHOD, RELOAD_METHOD
from tests.integration.inference.conftest import server_settings

REMOTE, LOCAL = ("203.0.113.7", 40000), ("127.0.0.1", 40000)
TOKEN = "t0ken-for-tests"


@pytest.fixture(scope="module")
def app(tiny_model, weights_root):
    return create_inference_app(server_settings(tiny_model, weights_root))


@pytest.fixture(scope="module")
def remote(app):
    with TestClient(app, client=REMOTE) as client:  # runs the lifespan: the model loads, the engine starts
        yield client


def _requests(lora_path: str, weights_path: str) -> dict[str, dict]:
    """One valid request per control route: each would load, unload, pause or reset if it were let through."""
    return {
        "/v1/load_lora_adapter": {"json": {"lora_name": "intruder", "lora_path": lora_path}},
        "/v1/unload_lora_adapter": {"json": {"lora_name": "policy-v1"}},
        "/collective_rpc": {"json": {"method": RELOAD_METHOD, "args": [weights_path], "kwargs": {"version": "99"}}},
        "/pause": {"params": {"mode": "wait"}},
        "/resume": {},
        "/reset_prefix_cache": {},
    }


def _state(client: TestClient) -> tuple:
    """What a control route would change: the served models, the weight version, the pause flag."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    models = sorted(card["id"] for card in client.get("/v1/models").json()["data"])
    info = client.post("/collective_rpc", json={"method": INFO_METHOD}, headers=auth)
    assert info.status_code == 200, info.text
    return models, info.json()["results"][0]["weight_version"], client.get("/is_paused").json()["is_paused"]


def _all_refused(client: TestClient, requests: dict[str, dict], headers: dict[str, str]) -> None:
    for path, kwargs in requests.items():
        response = client.post(path, headers=headers, **kwargs)
        assert response.status_code == 401, f"{path}: {response.status_code} {response.text}"
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["code"] == 401


def test_without_a_configured_token_remote_clients_are_refused_and_nothing_loads(
    remote, monkeypatch, lora_adapter, perturbed
):
    requests = _requests(str(lora_adapter[0]), str(perturbed[0]))
    monkeypatch.setenv(CONTROL_TOKEN_ENV, TOKEN)
    before = _state(remote)
    monkeypatch.delenv(CONTROL_TOKEN_ENV)
    _all_refused(remote, requests, {})
    monkeypatch.setenv(CONTROL_TOKEN_ENV, TOKEN)
    assert _state(remote) == before == (["policy"], "0", False)


def test_with_a_token_a_missing_or_wrong_one_is_refused_and_the_right_one_works(
    remote, monkeypatch, lora_adapter, perturbed
):
    monkeypatch.setenv(CONTROL_TOKEN_ENV, TOKEN)
    requests = _requests(str(lora_adapter[0]), str(perturbed[0]))
    before = _state(remote)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        _all_refused(remote, requests, headers)
    assert _state(remote) == before
    auth = {"Authorization": f"Bearer {TOKEN}"}
    # The same requests with the token: each is carried out (then undone, in order).
    load = remote.post("/v1/load_lora_adapter", headers=auth, **requests["/v1/load_lora_adapter"])
    assert load.status_code == 200, load.text
    assert "intruder" in _state(remote)[0]
    unload = remote.post("/v1/unload_lora_adapter", headers=auth, json={"lora_name": "intruder"})
    assert unload.status_code == 200, unload.text
    for path in ("/pause", "/reset_prefix_cache", "/resume", "/collective_rpc"):
        response = remote.post(path, headers=auth, **requests[path])
        assert response.status_code == 200, f"{path}: {response.text}"
    assert _state(remote) == (["policy"], "99", False)
    # Open routes need no token.
    assert remote.get("/health").status_code == 200
    completion = remote.post("/v1/completions", json={"model": "policy", "prompt": [1, 2, 3], "max_tokens": 2})
    assert completion.status_code == 200, completion.text


def test_a_local_client_needs_no_token_when_none_is_configured(app, monkeypatch, remote):
    """``make train`` on one machine: every service on 127.0.0.1, no setup."""
    monkeypatch.delenv(CONTROL_TOKEN_ENV, raising=False)
    local = TestClient(app, client=LOCAL)  # the app is already running (remote's lifespan)
    response = local.post("/reset_prefix_cache")
    assert response.status_code == 200, response.text


def test_the_shared_client_sends_the_configured_token_to_a_live_server(server_url, monkeypatch, lora_adapter):
    """What the trainer's publisher does (``SyncInferenceClient.load_lora``) over real HTTP, token set on both
    sides from the environment; a client built without it is refused and loads nothing."""
    monkeypatch.delenv(CONTROL_TOKEN_ENV, raising=False)
    outsider = SyncInferenceClient(server_url)  # no token when built
    monkeypatch.setenv(CONTROL_TOKEN_ENV, TOKEN)
    with outsider, pytest.raises(InferenceError) as refused:
        outsider.load_lora("intruder", str(lora_adapter[0]))
    assert refused.value.status_code == 401
    with SyncInferenceClient(server_url) as client:
        assert "intruder" not in {card.id for card in client.models()}
        client.load_lora("insider", str(lora_adapter[0]))
        assert "insider" in {card.id for card in client.models()}
        client.unload_lora("insider")
