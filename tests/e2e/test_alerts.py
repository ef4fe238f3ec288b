"""The alerts on a real run: the tiny model trains through the real services with a reward that cannot vary (one
token per turn: no answer is ever given), and ``make train``'s monitor fires "no learning signal" within the
steps its threshold allows, says it with what to do, and fires nothing else on the otherwise healthy run."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.alerts.monitor import summary_lines
from launcher.report import read_log
from tests.e2e.test_recipes import SMOKE, stack_redis

REPO = Path(__file__).resolve().parents[2]
STEPS = 4


@pytest.mark.slow
def test_a_reward_that_never_varies_fires_no_learning_signal_and_nothing_else(local_stack, monkeypatch):
    stack, sup, _ = local_stack
    stack_redis(stack).flushall()
    monkeypatch.setattr(stack, "alerts", {})  # what earlier sessions of this shared stack fired
    monkeypatch.setenv("CODA_ALERTS_NO_SIGNAL_STEPS", "3")  # tiny-cpu says 60: fire within this short run
    said: list[str] = []
    monkeypatch.setattr(stack, "say", said.append)
    env = {**SMOKE, "CODA_TRAINER_MAX_STEPS": str(STEPS), "CODA_ROLLOUT_MAX_TOKENS_PER_TURN": "1"}
    # No demonstrations: the demonstration loss of a policy trained from scratch is not what this tests.
    log = stack.train(sup, None, recipe=str(REPO / "configs/tiny-cpu.toml"), tag="alerts", **env)
    rows = read_log(log)
    assert len(rows) == STEPS
    assert all(r["zero_variance_groups"] == r["groups"] > 0 for r in rows), "the reward varied"
    assert set(stack.alerts) == {"NoLearningSignal"}, summary_lines(stack.alerts)
    fired = stack.alerts["NoLearningSignal"]
    assert 3 <= fired.step <= STEPS
    assert any(line.startswith("alert NoLearningSignal") and "n_samples" in line for line in said), said
