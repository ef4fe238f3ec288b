"""``python -m launcher train``: stopped with Ctrl-C and started again with the same command, the run
continues from the trainer's checkpoint (steps and versions go on, no group is trained twice) and finishes;
a recipe whose agent does not search starts no retriever."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher import runs
from launcher.report import read_log

REPO = Path(__file__).resolve().parents[3]
MAX_STEPS = 16  # room for the Ctrl-C to land mid-training: a tiny-model step takes ~2 s, and the poll is 0.5 s


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _train(root: Path, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODA_")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", CODA_TRAINER_MAX_STEPS=str(MAX_STEPS))
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "launcher",
                "train",
                "--recipe",
                "configs/tiny-cpu.toml",
                "--run-root",
                str(root),
                "--eval-limit",
                "4",
                "--progress-every-s",
                "2",
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            # A shell without job control starts background commands with SIGINT ignored, and that is inherited:
            # Python then installs no KeyboardInterrupt handler and the Ctrl-C below would be lost (the run
            # finishes with 0). The command is meant to run as if typed at a terminal.
            preexec_fn=_default_sigint,
        )


@pytest.mark.slow
def test_ctrl_c_then_the_same_command_continues_the_run(tmp_path):
    root, out = tmp_path / "runs", tmp_path / "out.txt"
    first = _train(root, out)
    deadline = time.monotonic() + 600
    while not (logs := list(root.glob("*/trainer/train.jsonl"))) or len(read_log(logs[0])) < 2:
        assert first.poll() is None, out.read_text()[-3000:]
        assert time.monotonic() < deadline, out.read_text()[-3000:]
        time.sleep(0.5)
    first.send_signal(
        signal.SIGINT
    )  # Ctrl-C: the terminal signals the supervisor (its services have their own sessions)
    assert first.wait(180) == 130, out.read_text()[-3000:]
    run = logs[0].parents[1]
    stopped_at = [r["step"] for r in read_log(logs[0])]
    assert runs.unfinished(root, str((REPO / "configs/tiny-cpu.toml").resolve())) == [run]

    second = _train(root, out)
    assert second.wait(900) == 0, out.read_text()[-3000:]
    text = out.read_text()
    assert f"resuming the unfinished run {run}" in text
    assert "training resumes from the checkpoint of step" in text
    assert [p.parent for p in root.glob(f"*/{runs.RUN_FILE}")] == [run]  # no second run folder
    steps = [r["step"] for r in read_log(logs[0])]
    # The steps go on from where the first command stopped: one log, each step once, in order, to the end.
    assert steps[: len(stopped_at)] == stopped_at and steps == list(range(1, MAX_STEPS + 1)), steps
    state = json.loads(sorted((run / "checkpoints").glob("step-*"))[-1].joinpath("state.json").read_text())
    assert state["step"] == MAX_STEPS and state["version"] >= MAX_STEPS
    trained = state["recent_groups"]
    assert len(trained) == len(set(trained)) == state["groups_trained"], "a group was trained twice"
    assert json.loads((run / runs.RUN_FILE).read_text())["finished"]
    assert "make train finished" in text and (run / "logs" / "stack.log").is_file()
    # A healthy run (resumed included) fires none of the RL-health alerts (docs/alerts.md).
    assert "alerts:      none fired" in text and "] alert " not in text, text[-3000:]


@pytest.mark.slow
def test_an_agent_that_does_not_search_gets_no_index_and_no_retriever(tmp_path):
    from launcher.config import StackSettings
    from launcher.supervisor import Supervisor
    from launcher.train import LocalStack

    recipe = "configs/recursive-reasoner.toml"  # a planner and a frozen worker: no search anywhere
    said: list[str] = []
    stack = LocalStack(recipe, StackSettings.load(recipe, run_root=str(tmp_path)), say=said.append)
    with Supervisor(stack.run / "logs") as sup:
        stack.prepare(sup)
        stack.start_servers(sup)
        assert [s.name for s in sup.services] == ["redis", "inference"]
        assert stack.make_sft(sup) is None
    assert not stack.layout.index.exists()
    assert "no index: the recursive-reasoner agent does not search" in said


def _train_to_end(root: Path, out: Path, *flags: str, **env: str) -> tuple[int, str, Path]:
    """``launcher train`` on tiny-cpu to its end: (exit code, what it printed, the run folder)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CODA_")}
    base.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **env)
    args = ["train", "--recipe", "configs/tiny-cpu.toml", "--run-root", str(root), "--eval-limit", "4", *flags]
    with open(out, "ab") as log:
        done = subprocess.run(
            [sys.executable, "-m", "launcher", *args],
            cwd=REPO,
            env=base,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=900,
        )
    runs_made = [p.parent for p in root.glob(f"*/{runs.RUN_FILE}")]
    return done.returncode, out.read_text(), runs_made[0] if runs_made else root


@pytest.mark.slow
def test_a_time_budget_ends_training_and_the_run_still_evaluates(tmp_path):
    """``[stack] train_budget_s``: training stops when the budget is spent (the trainer checkpoints, as on
    Ctrl-C), then the final eval runs and the run is finished."""
    code, text, run = _train_to_end(tmp_path / "runs", tmp_path / "out.txt", "--train-budget-s", "25")
    assert code == 0, text[-3000:]
    assert "training budget of 25s spent at step" in text and "make train finished" in text
    steps = [r["step"] for r in read_log(run / "trainer" / "train.jsonl")]
    assert 1 <= len(steps) < 500, steps  # tiny-cpu's max_steps is 500: the budget ended it
    assert list((run / "eval" / "final").glob("*.json"))
    assert json.loads((run / runs.RUN_FILE).read_text())["finished"]


@pytest.mark.slow
def test_a_warm_start_trains_on_demonstrations_alone_then_the_recipe_goes_on(tmp_path):
    """``[stack] warm_start_steps``: SFT-only steps (no rollouts), their own eval, then the recipe's training
    from that checkpoint; the summary shows all three evals."""
    code, text, run = _train_to_end(
        tmp_path / "runs", tmp_path / "out.txt", "--warm-start-steps", "3", CODA_TRAINER_MAX_STEPS="6"
    )
    assert code == 0, text[-3000:]
    assert "warm start: 3 steps on the demonstrations alone" in text
    assert "| step 0 | warm start (step 3) | step 6 |" in text
    assert text.count("first step done") == 1  # the warm start's: the run's first step
    rows = read_log(run / "trainer" / "train.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all(r.get("rl_sequences", 0) == 0 and r["sft_tokens"] > 0 for r in rows[:3])  # demonstrations only
    assert all(r["rl_sequences"] + r.get("skipped_zero_advantage", 0) > 0 for r in rows[3:])  # then rollouts too
    assert list((run / "eval" / "warm").glob("*.json"))


@pytest.mark.slow
def test_a_lora_run_starts_its_step_0_eval_after_the_first_step(tmp_path):
    """A LoRA run never changes the served base weights, so the step-0 eval runs beside training; it starts
    once the first step has landed, so that the first step's rollouts do not queue behind the eval's episodes
    on the one inference server. The first-step line is stamped with the trainer's own time of that step."""
    code, text, run = _train_to_end(
        tmp_path / "runs", tmp_path / "out.txt", CODA_TRAINER_FINETUNE="lora", CODA_TRAINER_MAX_STEPS="4"
    )
    assert code == 0, text[-3000:]
    first = text.index("first step done")
    assert first < text.index("step-0 eval started beside training") < text.index("eval-step0 done beside training")
    rows = read_log(run / "trainer" / "train.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert list((run / "eval" / "step0").glob("*.json")) and list((run / "eval" / "final").glob("*.json"))
    assert "| step 0 |" in text and json.loads((run / runs.RUN_FILE).read_text())["finished"]
