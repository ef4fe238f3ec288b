"""A user's own task, as a user would bring it: a recipe TOML and one Python reward file, both outside the
project tree (the file on PYTHONPATH), trained end to end by ``python -m launcher train``.

The task: the single-turn agent on the lookup world's prompts with the tiny model; the reward is 1 when the
completion contains "the". The tiny model starts near 5%; GRPO alone raises it within 30 steps.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.report import read_log

REPO = Path(__file__).resolve().parents[3]
STEPS = 30

REWARD = """
def contains_the(completion, gold, row):
    assert isinstance(gold, list) and row["question"]  # the row as read, gold answers as a list
    return {"reward": float("the" in completion), "length": float(len(completion))}
"""


def _recipe(tmp: Path) -> Path:
    text = (REPO / "configs" / "single-turn.toml").read_text()
    assert '# reward = "my_rewards:contains_word"' in text  # the line the recipe tells users to fill in
    path = tmp / "contains-the.toml"
    path.write_text(text.replace('# reward = "my_rewards:contains_word"', 'reward = "user_rewards:contains_the"'))
    return path


def _train(tmp: Path, recipe: Path, user: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODA_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(user), str(REPO)]), OMP_NUM_THREADS="1", CODA_TRAINER_MAX_STEPS=str(STEPS)
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher",
            "train",
            "--recipe",
            str(recipe),
            "--new",
            "--run-root",
            str(tmp / "runs"),
            "--eval-limit",
            "4",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
def test_a_user_reward_trains_a_single_turn_task(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "user_rewards.py").write_text(REWARD)
    done = _train(tmp_path, _recipe(tmp_path), user)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    rows = read_log(next((tmp_path / "runs").glob("*/trainer/train.jsonl")))
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    rewards = [r["reward_mean"] for r in rows]
    assert all("reward/length" in r for r in rows)  # the user's components reach the trainer's metrics
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last >= first + 0.3, rewards  # measured: 0.09 → 1.00


def test_a_reward_that_cannot_be_imported_stops_the_start(tmp_path):
    recipe = tmp_path / "bad.toml"
    recipe.write_text('[rollout]\nagent = "single-turn"\nreward = "no_such_module:reward"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODA_")}
    done = subprocess.run(
        [sys.executable, "-m", "services.rollout", "eval", "--recipe", str(recipe)],
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "no_such_module" in done.stderr and "PYTHONPATH" in done.stderr, done.stderr[-2000:]
