"""``[stack] train_budget_s`` is a budget of training time: its clock starts when the trainer and the rollout
are up, not when the command started (preparation, a step-0 eval before training and a warm start are outside
it), as its description says."""

from __future__ import annotations

import time

from launcher.config import StackSettings
from launcher.reference import render
from launcher.train import LocalStack

RECIPE = "configs/tiny-cpu.toml"


class RecordingSupervisor:
    """Only what ``LocalStack.train`` asks of a supervisor: the wait (the trainer finishes at once) and stops."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def wait_for(self, service, *, timeout_s, on_tick, tick_s) -> int:
        self.timeouts.append(timeout_s)
        return 0

    def stop(self, service) -> None:
        pass


def _train(tmp_path, monkeypatch, **settings) -> list[float]:
    stack = LocalStack(RECIPE, StackSettings.load(RECIPE, run_root=str(tmp_path), **settings), say=lambda m: None)
    stack.started = time.time() - 3600  # the command started an hour ago: preparation took that long
    monkeypatch.setattr(stack, "start_training", lambda sup, sft, **kwargs: (object(), None))
    sup = RecordingSupervisor()
    stack.train(sup, None)
    return sup.timeouts


def test_the_training_budget_counts_from_the_start_of_training_not_of_the_command(tmp_path, monkeypatch):
    assert _train(tmp_path, monkeypatch, train_budget_s=30) == [30]  # the whole budget, an hour after the command
    assert _train(tmp_path, monkeypatch) == [StackSettings.load(RECIPE).train_timeout_s]  # no budget: the timeout
    doc = render()
    row = next(line for line in doc.splitlines() if line.startswith("| `train_budget_s` |"))
    assert "Counted from the start of training" in row and "not from the command's" in row
