"""Observability: the JSONL log, the Prometheus gauges behind /metrics and /health, the PNG plots."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

from fastapi.testclient import TestClient

from services.trainer.app import build_app
from services.trainer.metrics import RedMetrics, RlMetrics, StepRecord
from services.trainer.observe import Observer


def _rec(step: int) -> StepRecord:
    return StepRecord(
        step=step,
        rl=RlMetrics(loss=0.5 / step, pg_loss=0.4, clip_fraction=float("nan")),
        reward_mean=0.1 * step,
        rewards={"f1": 0.2},
        red=RedMetrics(final_weight=1.5),
        tokens_per_second=1000.0,
    )


def test_jsonl_gauges_and_plots(tmp_path):
    holder = {}
    app, registry = build_app(lambda: holder.get("t"))
    obs = Observer(registry, str(tmp_path), plot_every=2)
    for step in (1, 2, 3):
        obs.record(_rec(step))
    obs.published(version=3, seconds=0.25)
    lines = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3] and "clip_fraction" not in lines[0]  # NaN left out
    assert lines[0]["reward/f1"] == 0.2 and lines[0]["red/final_weight"] == 1.5 and lines[0]["time"] > 0
    assert (tmp_path / "losses.png").stat().st_size > 1000 and (tmp_path / "rewards.png").is_file()
    client = TestClient(app)
    metrics = client.get("/metrics").text
    assert "coda_trainer_step 3.0" in metrics and "coda_trainer_red_final_weight 1.5" in metrics
    assert "coda_policy_version 3.0" in metrics and "coda_trainer_publish_seconds_hist_count 1.0" in metrics
    assert client.get("/health").status_code == 503  # no trainer yet
    holder["t"] = SimpleNamespace(
        ready=threading.Event(),
        steps_without_rl=0,
        state=SimpleNamespace(step=3, version=3, tokens=10, groups_trained=1, dropped_stale=0),
    )
    holder["t"].ready.set()
    assert client.get("/health").status_code == 200
    assert client.get("/status").json()["version"] == 3
    assert client.get("/status").json()["warnings"] == []
    # Training on nothing is loud: a warning on /status and a counter on /metrics.
    holder["t"].steps_without_rl = 4
    obs.without_rl(trained=False)
    assert "4 step(s)" in client.get("/status").json()["warnings"][0]
    metrics = client.get("/metrics").text
    assert 'coda_trainer_steps_without_rl_total{trained="nothing"} 1.0' in metrics


def test_wandb_offline_run_written(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    obs = Observer(
        None, str(tmp_path), plot_every=100, wandb_project="coda-test", wandb_mode="offline", config={"lr": 1e-3}
    )
    obs.record(_rec(1))
    obs.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert runs and runs[0].stat().st_size > 0
