"""``shared.body_limit.BodyGuard`` as a bare ASGI app: a client that leaves before its body is complete ends the
request as a 499, without running the app. Found by the API fuzz suite: the guard used to return without any
response, and the metrics middleware around it then raised "No response returned.", so every such request
was logged as an exception and counted as a 500."""

from __future__ import annotations

import asyncio
import json

from shared.body_limit import BodyGuard


def run_guard(messages: list[dict]) -> tuple[list[dict], bool]:
    """Feed ``messages`` to a guard around an app that records whether it ran; returns what was sent."""
    ran = False

    async def app(scope, receive, send) -> None:
        nonlocal ran
        ran = True

    pending = list(messages)

    async def receive() -> dict:
        return pending.pop(0)

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/x", "headers": [(b"content-type", b"application/json")]}
    asyncio.run(BodyGuard(app, max_bytes=1024, max_json_depth=8)(scope, receive, send))
    return sent, ran


def test_a_client_leaving_mid_body_gets_a_499_and_the_app_never_runs():
    sent, ran = run_guard([{"type": "http.request", "body": b'{"n": ', "more_body": True}, {"type": "http.disconnect"}])
    assert not ran
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 499
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == 499 and "disconnected after sending 6 bytes" in error["message"]


def test_a_whole_body_reaches_the_app():
    sent, ran = run_guard([{"type": "http.request", "body": b'{"n": 1}', "more_body": False}])
    assert ran and sent == []
