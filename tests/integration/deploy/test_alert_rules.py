"""deploy/prometheus/alerts.yml with Prometheus's own tool: ``promtool check rules`` (it parses) and ``promtool
test rules`` (each rule fires on its recorded failure and stays quiet on healthy series: alerts.test.yml).
Skipped with the reason where promtool is missing (Debian: ``apt-get install prometheus``; CI installs it)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.integration.deploy.project import ROOT

PROMETHEUS = ROOT / "deploy/prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian/Ubuntu: apt-get install prometheus; .ci/run does)"
)


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=120)


@needs_promtool
def test_promtool_check_rules():
    done = _promtool("check", "rules", "alerts.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@needs_promtool
def test_promtool_test_rules():
    done = _promtool("test", "rules", "alerts.test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
