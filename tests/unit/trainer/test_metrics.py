"""One definition of the trainer's metrics (services/trainer/metrics.py): the keys of a real step's log line,
the trainer's Prometheus gauges and the plotted keys all come from it, and every name the dashboards, the alert
rules and the docs query is one the trainer exports."""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry

from services.trainer.checkpoint import TrainState
from services.trainer.config import TrainerSettings
from services.trainer.metrics import (
    GAUGES,
    METRICS,
    PLOTTED,
    PROMETHEUS_PREFIX,
    REWARD_PREFIX,
    RlMetrics,
    StepRecord,
    flatten,
    line,
    unflatten,
)
from services.trainer.observe import Observer
from services.trainer.packing import TrainSeq, pack
from services.trainer.rl.red import REDConfig, REDState, red_weights
from services.trainer.step import Objective, RlSums, StepMetrics, StepResult
from services.trainer.step_record import Rollouts, step_record
from shared.stream import QueueStats
from tests.factories import make_group, make_weight_update

ROOT = Path(__file__).resolve().parents[3]
# Where other parts of the repository name the trainer's series: the dashboards, the alert rules and their
# recorded cases, the docs.
QUERIES = [
    *sorted((ROOT / "deploy/grafana/dashboards").glob("*.json")),
    ROOT / "deploy/prometheus/alerts.yml",
    ROOT / "deploy/prometheus/alerts.test.yml",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "README.md",
]


def _rl_sums():
    """A real RL micro-batch through the real objective, with every metric it can report: decoupled importance
    sampling (IS weights and the mismatch), a KL term against reference logprobs."""
    seq = TrainSeq(
        [5, 6, 7, 8],
        [0, 1, 1, 1],
        {"old_logp": [0.0, -1.5, -1.0, -0.5], "adv": [1.0] * 4, "staleness": [0.0, 1.0, 1.0, 1.0]},
        0,
    )
    batch = pack([seq], 16)[0]
    batch.fields["ref_logp"] = torch.full(batch.input_ids.shape, -1.2)
    logp = torch.full(batch.input_ids.shape, -1.0, requires_grad=True)
    objective = Objective(TrainerSettings(kl_coef=0.1, importance={"mode": "token+sequence"}))
    _, sums = objective(logp, torch.full_like(logp, 2.0), batch, {"tokens": 3, "sequences": 1, "world": 1})
    return sums


def _full_step(tmp_path) -> tuple[dict, CollectorRegistry, Observer]:
    """One step with RL, SFT, RED, rollouts and a publish, through step_record and the Observer."""
    metrics = StepMetrics(_rl_sums(), rl_entropy_sum=6.0, sft_entropy_sum=4.0, sft_loss_sum=5.0, tokens=20.0)
    result = StepResult(metrics, 3.0, 1.0, 2.0, 0.1, 1, 1, grad_norm=0.5, lr=1e-5, seconds=1.0)
    state = REDState(h_rl=1.0, h_rl_prev=1.1, h_sft=2.0, h_sft_prev=2.2)
    red = red_weights(state, REDConfig(), accuracy=0.5, sft_coef=0.1)
    groups = [make_group("q1", version=2), make_group("q2", version=3)]
    rollouts = Rollouts(groups, 1, 2, 0, QueueStats(depth=4, pending=2, lag=1, dead_letters=0))
    train = TrainState(step=10, version=3, tokens=200, dropped_stale=4)
    rec = step_record(result, train, 1.5, red=red, rollouts=rollouts, publish=make_weight_update(3), sync_diff=1e-6)
    registry = CollectorRegistry()
    obs = Observer(registry, str(tmp_path), plot_every=1000)
    obs.record(rec)
    obs.published(3, 0.2)
    obs.without_rl(trained=True)
    (logged,) = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    return logged, registry, obs


def test_log_gauges_and_plots_come_from_the_record(tmp_path):
    logged, registry, _ = _full_step(tmp_path)
    keys = {k for k in logged if not k.startswith(REWARD_PREFIX)}
    assert keys == set(METRICS), "a full step logs every quantity of the record, and nothing else"
    assert {k for k in logged if k.startswith(REWARD_PREFIX)} == {"reward/f1"}
    gauges = {f.name: f.samples[0].value for f in registry.collect() if f.type == "gauge"}
    trainer = {name: value for name, value in gauges.items() if name.startswith(PROMETHEUS_PREFIX)}
    assert set(trainer) == {m.prometheus for m in GAUGES}
    for m in GAUGES:  # the gauge is the record key, prefixed, '/' as '_', and shows the key's value
        assert m.prometheus == PROMETHEUS_PREFIX + m.key.replace("/", "_")
        assert trainer[m.prometheus] == pytest.approx(logged[m.key])
    assert set(PLOTTED) <= set(METRICS) and "reward_mean" in PLOTTED
    assert all(m.description for m in METRICS.values()), "a record key without a description"
    assert len({m.series for m in METRICS.values()}) == len(METRICS), "two keys map to one Prometheus name"


def test_every_trainer_series_named_elsewhere_is_exported(tmp_path):
    _, registry, _ = _full_step(tmp_path)
    families = list(registry.collect())  # a family's name (the docs') and its series' (_total, _bucket, ...)
    exported = {f.name for f in families} | {s.name for f in families for s in f.samples}
    unknown = []
    for path in QUERIES:
        for name in set(re.findall(r"coda_trainer_[a-z0-9_]+", path.read_text())):
            # ``coda_trainer_staleness_*`` in prose: a prefix of exported names
            known = any(e.startswith(name) for e in exported) if name.endswith("_") else name in exported
            if not known:
                unknown.append(f"{path.relative_to(ROOT)}: {name}")
    assert not unknown, "names no trainer series has:\n" + "\n".join(unknown)


def test_unmeasured_metrics_cross_ranks_as_nan_and_come_back_none():
    sums = StepMetrics(RlSums(RlMetrics(pg_loss=0.5), tokens=1.0), tokens=2.0)
    values = flatten(sums)
    assert len(values) == len(fields(RlMetrics)) + 5  # the RL sums, their tokens, the step's four sums
    assert math.isnan(values[0]) and values[1] == 0.5  # loss (not measured), pg_loss: in declared order
    back = unflatten(sums, [2 * v for v in values])  # two ranks alike
    assert back == StepMetrics(RlSums(RlMetrics(pg_loss=1.0), tokens=2.0), tokens=4.0)
    with pytest.raises(ValueError, match="more values"):
        unflatten(sums, [*values, 0.0])
    assert line(StepRecord()) == {}  # nothing measured, nothing logged
