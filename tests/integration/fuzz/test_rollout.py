"""Fuzz every route of the rollout service (``/status``, ``/health``, ``/metrics``) from its OpenAPI schema,
while its producer runs CoDA episodes against the scripted LLM into a real Redis."""

from __future__ import annotations

import time

import httpx

from tests.integration.fuzz.openapi import Target, fuzz_service, summary


def test_every_rollout_route_survives_fuzzing(fuzz_rollout, monkeypatch):
    url, app = fuzz_rollout
    results = fuzz_service(Target(url, app), monkeypatch)
    print(summary(results))
    assert set(results) == {"GET /status [any]", "GET /health [any]", "GET /metrics [any]"}
    deadline = time.monotonic() + 60
    while (status := httpx.get(url + "/status", timeout=10).json())["published"] < 2:  # admission lets two through
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    assert status["published"] == 2 and status["admission"]["capacity"] == 0
    assert httpx.get(url + "/health", timeout=10).status_code == 200
