"""One name per quantity: the keys of the log, the trainer's Prometheus gauges and the plots all come from the
metrics table (``services/trainer/metrics.py``), compared here on a real record of a full step."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry

from services.stack import glossary
from services.stack.alerts.rules import RULES
from services.stack.alerts.settings import AlertSettings
from services.trainer.batch_loss import RlMetrics
from services.trainer.metrics import BY_KEY, GAUGE_PREFIX, GAUGES, METRICS, PLOTTED, REWARD_PREFIX, gauge_name
from services.trainer.observe import Observer
from services.trainer.rl.red import REDWeights
from services.trainer.step import StepMetrics
from services.trainer.step_record import Rollouts, step_record
from shared.protocol import WeightUpdate
from shared.stream import QueueStats
from tests.unit.trainer.test_step_record import STATE, _groups, _result, _rl_metrics


def _full_record() -> dict[str, float]:
    """A step with RL, SFT, RED, rollouts, a publish and a sync check: every part of the record written."""
    metrics = StepMetrics(_rl_metrics(), rl_entropy_sum=60.0, sft_entropy_sum=20.0, sft_loss_sum=25.0, tokens=100.0)
    red = REDWeights(2.0, 1.5, 3.0, 0.3, batch_accuracy=0.25, h_rl=1.2, h_rl_prev=1.1, h_sft=0.9, h_sft_prev=0.8)
    rollouts = Rollouts(_groups(), 1, 2, 1, QueueStats(depth=9, pending=3, lag=2, dead_letters=0))
    publish = WeightUpdate(
        version=4, kind="lora", model_name="policy-v4", path="/w", step=7, created_at=0, publish_seconds=0.75
    )
    return step_record(_result(metrics), STATE, 2.5, red=red, rollouts=rollouts, publish=publish, sync_diff=1e-5)


def test_every_log_key_is_a_defined_quantity(tmp_path):
    rec = _full_record()
    Observer(None, str(tmp_path), plot_every=1000).record(rec)
    written = json.loads((tmp_path / "train.jsonl").read_text())
    components = {k for k in written if k.startswith(REWARD_PREFIX)}
    assert components == {"reward/f1"}
    assert set(written) - components <= set(BY_KEY)
    # What the code can write and what the table defines are the same set (the glossary's AST check).
    assert glossary.log_keys() == set(BY_KEY)


def test_the_prometheus_gauges_are_the_record_keys(tmp_path):
    registry = CollectorRegistry()
    rec = _full_record()
    Observer(registry, str(tmp_path), plot_every=1000).record(rec)
    gauges = {
        f.name: f.samples[0].value for f in registry.collect() if f.type == "gauge" and f.name.startswith(GAUGE_PREFIX)
    }
    assert set(gauges) == {m.gauge_name for m in GAUGES}
    for m in GAUGES:
        assert gauge_name(m.key) == GAUGE_PREFIX + m.key.replace("/", "_")
        if m.key in rec:  # the gauge shows the record's value under the record's name
            assert gauges[m.gauge_name] == pytest.approx(rec[m.key])
    assert gauges[gauge_name("red/final_weight")] == pytest.approx(rec["red/final_weight"])
    # The glossary's Prometheus section lists the same gauges.
    listed = {f.name for f in glossary.prometheus_families() if f.where == "services/trainer/observe.py"}
    assert {m.gauge_name for m in GAUGES} <= listed


def test_plots_alerts_and_glossary_use_the_defined_names(tmp_path):
    assert set(PLOTTED) <= set(BY_KEY) and "reward_mean" in PLOTTED
    obs = Observer(None, str(tmp_path), plot_every=1)
    obs.record(_full_record())
    assert (tmp_path / "losses.png").stat().st_size > 1000
    # Every trainer series an alert queries is a gauge of the table (or one of the Observer's own families).
    others = {"coda_trainer_publish_seconds_hist", "coda_trainer_steps_without_rl"}
    names = {m.gauge_name for m in GAUGES} | others
    for rule in RULES:
        for token in (
            rule.expr(AlertSettings()).replace("(", " ").replace(")", " ").replace("[", " ").replace("{", " ").split()
        ):
            if token.startswith(GAUGE_PREFIX):
                assert token.removesuffix("_total").removesuffix("_count") in names, (rule.name, token)
    assert {m.key: m.meaning for m in METRICS} == glossary.LOG_KEYS


def test_an_undefined_metric_is_refused():
    rl = RlMetrics()
    with pytest.raises(KeyError, match="does not define"):
        rl.add({"num_tokens": 1.0, "entropy": 2.0})
    rec = _full_record() | {"entropyy": 1.0}
    with pytest.raises(KeyError, match="entropyy"):
        Observer(None, "/tmp/unused-metric-names").record(rec)


def test_rank_sums_flatten_in_the_tables_order():
    """Two ranks whose micro-batches reported the same metrics in another order still line up."""
    part = {"loss": 0.5, "pg_loss": 0.25, "ratio_mean": 2.0, "clip_fraction": 0.5, "num_tokens": 10.0}
    a, b = RlMetrics(), RlMetrics()
    a.add(part)
    b.add(dict(reversed(part.items())))
    flats: list[list[float]] = []

    def gather(flat: list[float]) -> list[float]:
        flats.append(flat)
        return flat

    StepMetrics(a).total(gather)
    StepMetrics(b).total(gather)
    assert flats[0] == flats[1]
    # after the five step sums: the shares (loss, pg_loss), then the token sums, in the table's order
    assert flats[0][5:] == [0.5, 0.25, 5.0, 20.0]
