"""``[stack] eval_limit = 0`` turns the held-out eval off: no step-0, warm-start or final eval runs, and the
closing summary shows the training reward alone. The run's phases are driven here with the services' parts
stubbed (nothing is started); the same run with evals on asks for each eval, so the stubs do see them."""

from __future__ import annotations

import json

import pytest

from launcher import runs
from launcher.config import StackSettings
from launcher.prepare import check_datasets
from launcher.report import EvalResult, render_summary
from launcher.train import LocalStack

RECIPE = "configs/tiny-cpu.toml"  # full fine-tuning: the step-0 eval runs before training, not beside it


def _stubbed(tmp_path, monkeypatch, **settings) -> tuple[LocalStack, list[str]]:
    stack = LocalStack(RECIPE, StackSettings.load(RECIPE, run_root=str(tmp_path), **settings), say=lambda m: None)
    evaluated: list[str] = []

    def train(sup, sft, **kwargs):
        log = stack.run / "trainer" / "train.jsonl"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(json.dumps({"step": s, "reward_mean": s / 10}) + "\n" for s in range(1, 6)))
        return log

    def evaluate(sup, label):
        evaluated.append(label)
        return EvalResult(path=stack.run / "eval" / label / "r.json", n=4, metrics={"em": 0.5})

    monkeypatch.setattr(stack, "prepare", lambda sup: None)
    monkeypatch.setattr(stack.processes, "start_servers", lambda sup, **kwargs: None)
    monkeypatch.setattr(stack, "make_sft", lambda sup: stack.run / "sft.jsonl")
    monkeypatch.setattr(stack, "train", train)
    monkeypatch.setattr(stack, "evaluate", evaluate)
    monkeypatch.setattr(stack, "start_base_eval", lambda sup: evaluated.append("beside"))
    return stack, evaluated


@pytest.mark.parametrize(("eval_limit", "evals"), [(None, ["step0", "warm", "final"]), (0, [])])
def test_eval_limit_0_runs_no_held_out_eval(tmp_path, monkeypatch, eval_limit, evals):
    stack, evaluated = _stubbed(tmp_path, monkeypatch, eval_limit=eval_limit, warm_start_steps=2)
    summary = stack.run_all()
    assert evaluated == evals
    assert json.loads((stack.run / runs.RUN_FILE).read_text())["finished"]
    assert "| step 0 | warm start (step 2) | step 5 |" in summary
    if eval_limit == 0:
        assert "| no held-out eval ([stack] eval_limit = 0) |" in summary and "| em |" not in summary
        assert "evals:" not in summary
    else:
        assert "| greedy eval, held-out (4 prompts) |" in summary and "| em | 0.500 | 0.500 | 0.500 |" in summary
    assert "| training reward (mean of first/last 5 steps) | — | 0.300 | 0.300 |" in summary


def test_the_summary_without_evals_shows_the_training_reward(tmp_path):
    log = tmp_path / "trainer" / "train.jsonl"
    log.parent.mkdir()
    log.write_text("".join(json.dumps({"step": s, "reward_mean": s / 10}) + "\n" for s in range(1, 11)))
    summary = render_summary(tmp_path, None, None, 60)
    assert "| no held-out eval ([stack] eval_limit = 0) | step 0 | step 10 |" in summary
    assert "| training reward (mean of first/last 5 steps) | 0.300 | 0.800 |" in summary
    assert "evals:" not in summary and f"checkpoints: {tmp_path / 'checkpoints'}" in summary


def test_with_the_eval_off_its_dataset_is_not_checked():
    check_datasets(RECIPE, StackSettings.load(RECIPE, eval_limit=0, eval_dataset="no/such/file.jsonl"))
    with pytest.raises(ValueError, match=r"eval_dataset = 'no/such/file\.jsonl'"):
        check_datasets(RECIPE, StackSettings.load(RECIPE, eval_dataset="no/such/file.jsonl"))
