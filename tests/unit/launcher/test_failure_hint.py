"""When a run fails (a service died), ``train`` says how to go on: the same command, less ``--new``, resumes the
run from its last checkpoint; the line it prints is a command that does pick that run up again."""

from __future__ import annotations

import logging
import shlex

import pytest

from launcher import __main__ as stack_main
from launcher import processes
from launcher.train import LocalStack

RECIPE = "configs/tiny-cpu.toml"


@pytest.fixture(autouse=True)
def _root_logger():
    """``train`` points the root logger at the run's log and the terminal: put it back after each test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)


def _fail_with(monkeypatch, runs_seen: list) -> None:
    def run_all(self):
        runs_seen.append(self.run)
        raise RuntimeError("trainer exited with code -9; last log lines:\n(killed)")

    monkeypatch.setattr(LocalStack, "run_all", run_all)


def test_a_failed_run_says_the_command_that_resumes_it(tmp_path, monkeypatch, capsys):
    runs_seen: list = []
    _fail_with(monkeypatch, runs_seen)
    flags = ["--run-root", str(tmp_path / "runs"), "--eval-limit", "4"]
    assert stack_main.main(["train", "--recipe", RECIPE, "--new", *flags]) == 1
    out = capsys.readouterr().out
    assert "FAILED: trainer exited with code -9" in out
    assert (
        f"the same command resumes this run (no checkpoint yet: training starts over), keeping what it prepared ({runs_seen[0]})"
        in out
    )
    again = next(line.strip() for line in out.splitlines() if " -m launcher train" in line)
    assert "--new" not in again and again.endswith(shlex.join(["train", "--recipe", RECIPE, *flags]))
    assert f"(or: make train RECIPE=tiny-cpu ARGS={shlex.quote(shlex.join(flags))})" in out

    # The printed command, run again, continues that run (and, with a checkpoint, says from which step).
    monkeypatch.setattr(processes, "checkpoint_step", lambda folder: 3)
    assert stack_main.main(shlex.split(again)[3:]) == 1
    out = capsys.readouterr().out
    assert runs_seen[1] == runs_seen[0] and f"resuming the unfinished run {runs_seen[0]}" in out
    assert "the same command resumes this run from its checkpoint of step 3" in out


def test_a_recipe_outside_configs_gets_the_python_line_alone(tmp_path, monkeypatch):
    recipe = tmp_path / "mine.toml"
    hint = stack_main.resume_hint(["train", "--recipe", str(recipe), "--new"], tmp_path / "run")
    assert shlex.join(["-m", "launcher", "train", "--recipe", str(recipe)]) in hint
    assert "--new" not in hint and "make train" not in hint
