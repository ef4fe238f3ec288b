"""``make train``'s monitor: an alert is said once when it starts firing and once when it clears, at most every
``every_s``, and the closing table lists what fired; a recipe's ``[alerts]`` reaches it."""

from __future__ import annotations

from launcher.alerts.monitor import Monitor, monitor_for, summary_lines
from launcher.alerts.observed import parse_scrape
from launcher.alerts.settings import AlertSettings
from launcher.report import render_summary
from tests.unit.launcher.alerts.test_checks import healthy_step


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _monitor(records: list[dict], **settings) -> tuple[Monitor, list[str], Clock]:
    said, clock = [], Clock()
    s = AlertSettings.model_construct(**settings)
    return Monitor(s, lambda: records, None, said.append, every_s=5.0, clock=clock), said, clock


def test_an_alert_is_said_once_when_it_fires_and_once_when_it_clears():
    records = [healthy_step(i, zero_variance_groups=2) for i in range(1, 4)]
    monitor, said, clock = _monitor(records, no_signal_steps=3)
    monitor.tick()
    assert len(said) == 1 and said[0].startswith("alert NoLearningSignal (step 3): 100% of groups")
    assert "n_samples" in said[0]  # what to do comes with it
    clock.now += 1
    monitor.tick()  # within every_s: not evaluated
    clock.now += 5
    monitor.tick()  # evaluated, still firing: nothing new said
    assert len(said) == 1
    records += [healthy_step(i, zero_variance_groups=0) for i in range(4, 7)]
    clock.now += 5
    monitor.tick()
    assert said[-1] == "alert NoLearningSignal cleared (step 6)"
    lines = summary_lines(monitor.fired)
    assert lines[1].split()[:5] == ["NoLearningSignal", "first", "at", "step", "3,"] and "cleared" in lines[1]


def test_a_healthy_run_says_nothing_and_the_table_says_none_fired(tmp_path):
    monitor, said, _ = _monitor([healthy_step(i) for i in range(1, 30)])
    monitor.tick()
    assert said == [] and monitor.fired == {}
    table = render_summary(tmp_path, None, None, 60.0, alerts=summary_lines(monitor.fired))
    assert "alerts:      none fired" in table


def test_disabled_alerts_are_not_evaluated():
    monitor, said, _ = _monitor([healthy_step(i, zero_variance_groups=2) for i in range(1, 4)], no_signal_steps=3)
    monitor.settings = AlertSettings.model_construct(enabled=False, no_signal_steps=3)
    monitor.tick()
    assert said == []


def test_the_recipes_alerts_table_reaches_the_monitor(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[alerts]\nno_signal_steps = 7\n")
    monitor = monitor_for(str(recipe), tmp_path / "train.jsonl", 8004, print)
    assert monitor.settings.no_signal_steps == 7
    assert monitor.metrics_url == "http://127.0.0.1:8004/metrics"
    assert monitor.read_records() == []


def test_a_scrape_of_the_rollouts_metrics_is_read_by_name_and_labels():
    text = (
        "# TYPE coda_rollout_groups_total counter\n"
        'coda_rollout_groups_total{outcome="published"} 7.0\n'
        'coda_rollout_groups_total{outcome="failed"} 2.0\n'
        "# TYPE coda_rollout_server_up gauge\n"
        'coda_rollout_server_up{server="http://a:8002"} 0.0\n'
    )
    scrape = parse_scrape(text, 5.0)
    assert scrape.total("coda_rollout_groups_total", outcome="published") == 7.0
    assert scrape.total("coda_rollout_groups_total") == 9.0
    assert scrape.total("coda_rollout_server_up", server="http://a:8002") == 0.0
    assert scrape.total("coda_rollout_server_version") is None
