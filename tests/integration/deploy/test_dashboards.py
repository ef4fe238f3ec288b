"""Grafana dashboards and Prometheus: every dashboard loads, is what the generator writes, queries only the
provisioned datasource, and every metric it names is exported by some service (or is vLLM's own)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import re

import pytest
import yaml
from prometheus_client import CollectorRegistry

from tests.integration.deploy.metric_names import (
    exported_families,
    exported_series,
    promql_metrics,
)
from tests.integration.deploy.project import ROOT

DASHBOARDS = ROOT / "deploy/grafana/dashboards"
REQUIRED = {"training", "pipeline", "retrieval", "inference"}


def _generator():
    return importlib.import_module("deploy.grafana.dashboards")


def _dashboards() -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def _targets(dashboard: dict):
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel, target


def _vllm_names() -> set[str]:
    lines = (ROOT / "deploy/prometheus/vllm-metrics.txt").read_text().splitlines()
    names = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    return {n + suffix for n in names for suffix in ("", "_bucket", "_sum", "_count")}


def test_every_dashboard_loads_and_is_well_formed():
    dashboards = _dashboards()
    assert set(dashboards) >= REQUIRED, f"missing dashboards: {REQUIRED - set(dashboards)}"
    uids = [d["uid"] for d in dashboards.values()]
    assert len(set(uids)) == len(uids)
    for name, dashboard in dashboards.items():
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(set(ids)) == len(ids), f"{name}: duplicate panel ids"
        assert sum(1 for _ in _targets(dashboard)) >= 6, f"{name} has almost no queries"
        for panel in dashboard["panels"]:
            grid = panel["gridPos"]
            assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, f"{name}: {panel['title']} is off the grid"


def test_dashboards_are_what_the_generator_writes():
    generator = _generator()
    for name, table in generator.DASHBOARDS.items():
        on_disk = (DASHBOARDS / f"{name}.json").read_text()
        assert on_disk == generator.dump(table), f"{name}.json is stale: run python -m deploy.grafana.dashboards"


def test_panels_query_the_provisioned_datasource():
    provisioned = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    uids = {d["uid"] for d in provisioned["datasources"]}
    for name, dashboard in _dashboards().items():
        for panel, target in _targets(dashboard):
            assert target["datasource"]["uid"] in uids, f"{name}: {panel['title']}"
            assert target["expr"].count("(") == target["expr"].count(")"), f"{name}: {target['expr']}"
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/coda-stack.yml").read_text())
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./deploy/grafana/dashboards:{provider['providers'][0]['options']['path']}:ro" in mounts


def test_every_dashboard_metric_is_exported_by_a_service_or_by_vllm():
    patterns = [re.compile(p) for p in exported_series(exported_families(ROOT))]
    vllm = _vllm_names()
    missing = []
    for name, dashboard in _dashboards().items():
        for panel, target in _targets(dashboard):
            for metric in promql_metrics(target["expr"]):
                # up and ALERTS are Prometheus's own series (ALERTS: the states of deploy/prometheus/alerts.yml).
                known = metric in ("up", "ALERTS") or metric in vllm or any(p.fullmatch(metric) for p in patterns)
                if not known:
                    missing.append(f"{name} / {panel['title']}: {metric}")
    assert not missing, "metrics no service exports:\n" + "\n".join(missing)


def test_promql_parsing_finds_metrics_and_ignores_the_rest():
    expr = (
        'histogram_quantile(0.99, sum by (le, stage) (rate(coda_x_bucket{stage="a b"}[$__rate_interval])))'
        " / ignoring(job) coda_y offset 5m + 1e-3 * vllm:num_requests_running"
    )
    assert promql_metrics(expr) == {"coda_x_bucket", "coda_y", "vllm:num_requests_running"}


def _registries_of_metric_modules():
    """Instantiate every class in a metric-defining module whose constructor takes a registry."""
    modules = {f.where.split(":")[0] for f in exported_families(ROOT)}
    for path in sorted(modules):
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            params = list(inspect.signature(cls.__init__).parameters.values())[1:]
            if not params or params[0].name != "registry":
                continue
            yield path, cls, params


def test_static_collection_matches_a_real_scrape(tmp_path):
    """What the source scan finds equals what the live registries expose, for every metric class we can
    build with a registry, plus the house app (shared.http.create_app)."""
    from shared.http import create_app

    registries = [create_app("deploytest")[1]]
    built = 0
    for _path, cls, params in _registries_of_metric_modules():
        kwargs = {
            p.name: str(tmp_path / p.name)
            for p in params[1:]
            if p.default is inspect.Parameter.empty and "dir" in p.name
        }
        if any(p.default is inspect.Parameter.empty for p in params[1:] if p.name not in kwargs):
            continue
        registry = CollectorRegistry()
        cls(registry, **kwargs)
        registries.append(registry)
        built += 1
    assert built >= 3, "expected the retriever, rollout, inference and trainer metric classes"
    patterns = [re.compile(p) for p in exported_series(exported_families(ROOT))]
    for registry in registries:
        for family in registry.collect():
            for sample in family.samples:
                assert any(p.fullmatch(sample.name) for p in patterns), (
                    f"{sample.name} is exported but the source scan missed it"
                )


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_dashboard_covers_its_topic(name):
    """The panels the issue lists for each dashboard are there (by the metric families they query)."""
    wanted = {
        "training": [
            "coda_rollout_reward_component",
            "coda_trainer_red_final_weight",
            "coda_trainer_loss",
            "coda_trainer_kl",
            "coda_trainer_clip_fraction",
            "coda_trainer_rl_entropy",
            "coda_trainer_step_seconds",
            "coda_trainer_tokens_per_second",
        ],
        "pipeline": [
            "coda_rollout_episodes_total",
            "coda_trainer_queue_lag",
            "coda_rollout_staleness_versions",
            "coda_rollout_admission_wait_seconds",
            "coda_trainer_publish_seconds",
            "coda_rollout_failures_total",
        ],
        "retrieval": ["coda_retriever_queries_total", "coda_http_request_seconds", "coda_retriever_batch_queries"],
        "inference": [
            "vllm:generation_tokens_total",
            "coda_inference_generation_tokens_total",
            "coda_inference_batch_size",
            "coda_inference_weight_version",
        ],
    }[name]
    exprs = " ".join(t["expr"] for _, t in _targets(_dashboards()[name]))
    for metric in wanted:
        assert metric in exprs, f"{name} dashboard does not show {metric}"
