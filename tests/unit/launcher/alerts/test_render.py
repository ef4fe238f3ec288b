"""The committed alert files are what ``python -m launcher.alerts`` writes from the rules, and they name
every rule, its thresholds and only metrics the services export."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from launcher.alerts.render import docs_markdown, prometheus_rules, rules_yaml
from launcher.alerts.rules import RULES
from launcher.alerts.settings import AlertSettings
from testing.alert_cases import CASES, promtool_tests
from tests.integration.deploy.metric_names import exported_families, exported_series, promql_metrics

ROOT = Path(__file__).resolve().parents[4]
DEFAULTS = AlertSettings.model_construct()
REGENERATE = "stale: run python -m launcher.alerts"


def test_committed_files_are_current():
    assert (ROOT / "deploy/prometheus/alerts.yml").read_text() == rules_yaml(DEFAULTS), REGENERATE
    assert (ROOT / "deploy/prometheus/alerts.test.yml").read_text() == promtool_tests(DEFAULTS), (
        "stale: run python -m testing.alert_cases"
    )
    assert (ROOT / "docs/alerts.md").read_text() == docs_markdown(DEFAULTS), REGENERATE


def test_prometheus_loads_the_rules_and_compose_mounts_them():
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert (
        "./deploy/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in compose["services"]["prometheus"]["volumes"]
    )


def test_every_rule_queries_only_exported_metrics():
    patterns = [re.compile(p) for p in exported_series(exported_families(ROOT))]
    for rule in prometheus_rules(DEFAULTS)["groups"][0]["rules"]:
        for metric in promql_metrics(rule["expr"]):
            assert any(p.fullmatch(metric) for p in patterns), f"{rule['alert']}: {metric} is exported by no service"


def test_every_rule_has_recorded_series_that_fire_it_and_that_do_not():
    for rule in RULES:
        outcomes = {case.fires for case in CASES if case.rule == rule.name}
        assert outcomes == {True, False}, f"{rule.name}: recorded cases {outcomes}"


def test_docs_list_every_rule_with_its_recipe_keys_and_what_to_do():
    doc = docs_markdown(DEFAULTS)
    for rule in RULES:
        section = doc.split(f"\n## {rule.name}\n", 1)[1].split("\n## ", 1)[0]
        assert "**What to do:**" in section
        for key in rule.thresholds:
            assert f"`[alerts] {key}` | `{getattr(DEFAULTS, key)!r}`" in section


def test_a_recipes_thresholds_reach_the_rules(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[alerts]\nclip_fraction = 0.35\nno_signal_steps = 50\n")
    settings = AlertSettings.load(recipe)
    assert settings.no_signal_steps == 50
    assert (
        "> 0.35"
        in next(r for r in prometheus_rules(settings)["groups"][0]["rules"] if r["alert"] == "ClipFractionHigh")["expr"]
    )
