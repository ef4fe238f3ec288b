"""Fuzz the trainer's HTTP face (``/status``, ``/health``, ``/metrics``) from its OpenAPI schema."""

from __future__ import annotations

import httpx

from tests.integration.fuzz.openapi import Target, fuzz_service, summary


def test_every_trainer_route_survives_fuzzing(fuzz_trainer, monkeypatch):
    url, app = fuzz_trainer
    results = fuzz_service(Target(url, app), monkeypatch)
    print(summary(results))
    assert set(results) == {"GET /status [any]", "GET /health [any]", "GET /metrics [any]"}
    status = httpx.get(url + "/status", timeout=10).json()
    assert (status["ready"], status["step"], status["version"], status["steps_without_rl"]) == (True, 7, 3, 1)
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    assert httpx.get(url + "/metrics", timeout=10).status_code == 200
