"""The control token (shared.auth): who may call a control route, the 401 it answers otherwise, and the
clients that send the token."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from shared.auth import CONTROL_TOKEN_ENV, bearer_headers, is_loopback
from shared.http import CONTROL, create_app
from shared.inference_client import InferenceClient
from shared.inference_sync import SyncInferenceClient

LOCAL, REMOTE = ("127.0.0.1", 50000), ("203.0.113.7", 50000)


class Load(BaseModel):
    path: str


def make_client(peer: tuple[str, int]) -> tuple[TestClient, list[str]]:
    """An app with one control route that records each call it lets through."""
    app, _ = create_app("demo")
    calls: list[str] = []

    @app.post("/load", dependencies=CONTROL)
    def load(body: Load) -> dict:
        calls.append(body.path)
        return {"loaded": body.path}

    return TestClient(app, client=peer), calls


def _refused(response, calls: list[str]) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    error = response.json()["error"]
    assert error["code"] == 401 and error["type"] == "UnauthorizedError" and error["message"]
    assert calls == []  # the route never ran


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "::1", "::ffff:127.0.0.1"])
def test_loopback_addresses(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["10.0.0.1", "172.17.0.1", "203.0.113.7", "::ffff:10.0.0.1", "testclient", "", None])
def test_other_addresses_and_names_are_not_loopback(host):
    assert not is_loopback(host)


def test_without_a_token_only_local_clients_may_call(monkeypatch):
    monkeypatch.delenv(CONTROL_TOKEN_ENV, raising=False)
    local, calls = make_client(LOCAL)
    assert local.post("/load", json={"path": "a"}).status_code == 200 and calls == ["a"]
    remote, calls = make_client(REMOTE)
    response = remote.post("/load", json={"path": "b"})
    _refused(response, calls)
    assert (
        CONTROL_TOKEN_ENV in response.json()["error"]["message"]
        and "203.0.113.7" in response.json()["error"]["message"]
    )


@pytest.mark.parametrize("peer", [LOCAL, REMOTE], ids=["local", "remote"])
def test_with_a_token_every_client_must_send_it(monkeypatch, peer):
    """Once configured the token is required from loopback too: other users of a shared host are no exception."""
    monkeypatch.setenv(CONTROL_TOKEN_ENV, "s3cret")
    client, calls = make_client(peer)
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Basic s3cret"},
        {"Authorization": "s3cret"},
    ):
        _refused(client.post("/load", json={"path": "x"}, headers=headers), calls)
    response = client.post("/load", json={"path": "x"}, headers={"Authorization": "Bearer s3cret"})
    assert response.status_code == 200 and calls == ["x"]


def test_an_empty_token_counts_as_none(monkeypatch):
    monkeypatch.setenv(CONTROL_TOKEN_ENV, "  ")
    client, calls = make_client(REMOTE)
    _refused(client.post("/load", json={"path": "x"}, headers={"Authorization": "Bearer "}), calls)
    assert bearer_headers() == {}


def test_the_token_is_checked_before_the_body(monkeypatch):
    """A caller without the token learns nothing from the route's own validation."""
    monkeypatch.setenv(CONTROL_TOKEN_ENV, "s3cret")
    client, calls = make_client(REMOTE)
    _refused(client.post("/load", json={"wrong": 1}), calls)


def test_open_routes_stay_open(monkeypatch):
    monkeypatch.setenv(CONTROL_TOKEN_ENV, "s3cret")
    client, _ = make_client(REMOTE)
    assert client.get("/health").status_code == 200


async def test_the_inference_clients_send_the_configured_token(monkeypatch):
    monkeypatch.setenv(CONTROL_TOKEN_ENV, "s3cret")
    with SyncInferenceClient("http://127.0.0.1:1") as sync:
        assert sync.client._http.headers["authorization"] == "Bearer s3cret"
    async with InferenceClient("http://127.0.0.1:1", api_key="other") as llm:
        assert llm._http.headers["authorization"] == "Bearer other"  # an explicit key wins
    monkeypatch.delenv(CONTROL_TOKEN_ENV)
    with SyncInferenceClient("http://127.0.0.1:1") as sync:
        assert "authorization" not in sync.client._http.headers


async def test_the_rollouts_aiohttp_client_sends_the_configured_token(monkeypatch):
    pytest.importorskip("aiohttp")
    from shared.inference_client import AiohttpCompletions

    monkeypatch.setenv(CONTROL_TOKEN_ENV, "s3cret")
    llm = AiohttpCompletions("http://127.0.0.1:1")
    session = llm._client()
    try:
        assert session.headers["Authorization"] == "Bearer s3cret"
    finally:
        await session.close()
