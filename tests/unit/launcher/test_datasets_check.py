"""The held-out eval reads its own dataset with its own fields, and ``train`` loads both datasets before anything
starts: a recipe whose training prompts come from a JSONL by ``[rollout] prompt_field`` keeps the bundled eval
set, and a dataset that cannot be read stops the command at once, naming the setting to fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from launcher.__main__ import main
from launcher.config import StackSettings
from launcher.prepare import check_datasets, eval_args
from services.rollout.__main__ import parser as rollout_parser
from services.rollout.config import RolloutSettings


def _recipe(tmp_path: Path, stack: str = "", rollout: str = "") -> str:
    """A single-turn recipe training on a JSONL of its own (``text`` holds the prompt, no gold answers)."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": f"Say something about {i}."}) + "\n" for i in range(5)))
    path = tmp_path / "task.toml"
    path.write_text(
        f'[rollout]\nagent = "single-turn"\ndataset = "{data}"\nprompt_field = "text"\n{rollout}\n[stack]\n{stack}\n'
    )
    return str(path)


def _eval_settings(recipe: str, stack: StackSettings, tmp_path: Path) -> RolloutSettings:
    """The settings ``python -m services.rollout eval`` builds from the command make train gives it."""
    args = rollout_parser().parse_args([*eval_args(stack, tmp_path / "eval"), "--recipe", recipe][1:])
    return RolloutSettings.from_args(args)


def test_the_eval_dataset_is_not_read_with_the_training_prompt_field(tmp_path):
    recipe = _recipe(tmp_path)
    stack = StackSettings.load(recipe)
    assert RolloutSettings.load(recipe).records()[0].question == "Say something about 0."
    held_out = _eval_settings(recipe, stack, tmp_path)
    assert (held_out.dataset, held_out.prompt_field, held_out.gold_field) == ("bundled:lookup-test", None, None)
    records = held_out.records()  # was: FileNotFoundError "dataset not found: bundled:lookup-test"
    assert records and all(r.golden_answers for r in records)
    check_datasets(recipe, stack)


def test_the_eval_dataset_has_fields_of_its_own(tmp_path):
    questions = tmp_path / "held-out.jsonl"
    questions.write_text("".join(json.dumps({"q": f"Q{i}?", "a": [f"A{i}"]}) + "\n" for i in range(3)))
    recipe = _recipe(tmp_path, stack=f'eval_dataset = "{questions}"\neval_prompt_field = "q"\neval_gold_field = "a"\n')
    stack = StackSettings.load(recipe)
    records = _eval_settings(recipe, stack, tmp_path).records()
    assert [(r.question, r.golden_answers) for r in records] == [(f"Q{i}?", [f"A{i}"]) for i in range(3)]
    check_datasets(recipe, stack)
    with pytest.raises(ValidationError, match="eval_gold_field needs eval_prompt_field"):
        StackSettings.load(recipe, eval_prompt_field="")


@pytest.mark.parametrize(
    ("stack", "rollout", "names"),
    [
        ('eval_prompt_field = "text"', "", ["[stack] eval_dataset = 'bundled:lookup-test'", "eval_prompt_field"]),
        ('eval_dataset = "no/such/file.jsonl"', "", ["[stack] eval_dataset = 'no/such/file.jsonl'", "not found"]),
        ("", 'split = "test"', ["[rollout] dataset", "split 'test'", "no prompts in that split"]),
    ],
)
def test_a_dataset_that_cannot_be_read_fails_the_check_naming_the_setting(tmp_path, stack, rollout, names):
    recipe = _recipe(tmp_path, stack=stack, rollout=rollout)
    with pytest.raises(ValueError) as failed:
        check_datasets(recipe, StackSettings.load(recipe))
    assert all(name in str(failed.value) for name in names), str(failed.value)


def test_train_stops_before_making_a_run_folder_when_a_dataset_cannot_be_read(tmp_path, capsys):
    recipe = _recipe(tmp_path, rollout="", stack='eval_prompt_field = "text"')
    root = tmp_path / "runs"
    assert main(["train", "--recipe", recipe, "--run-root", str(root)]) == 2
    out = capsys.readouterr().out
    assert "FAILED: [stack] eval_dataset = 'bundled:lookup-test' (eval_prompt_field 'text'" in out
    assert not root.exists()  # no run folder, nothing started
