"""The rollout's app runs one plain ``Runtime`` (its metrics its own, on the app's registry), started and
stopped by the app's lifespan, as the trainer's app runs beside its ``Trainer``."""

from __future__ import annotations

from fastapi.testclient import TestClient

from services.rollout.app import Runtime, build_app
from services.rollout.config import RolloutSettings


def test_the_app_serves_its_runtimes_metrics_before_it_starts():
    app = build_app(RolloutSettings())
    runtime = app.state.runtime
    assert isinstance(runtime, Runtime) and runtime.producer is None and runtime.tasks == []
    client = TestClient(app)  # not entered: the lifespan (Redis, the servers) would start the runtime
    text = client.get("/metrics").text
    assert "coda_rollout_episodes_total" in text and "coda_http_requests_total" in text  # one registry


def test_a_runtime_owns_its_registry():
    a, b = Runtime(RolloutSettings()), Runtime(RolloutSettings())
    assert a.registry is not b.registry and a.metrics.registry is a.registry
