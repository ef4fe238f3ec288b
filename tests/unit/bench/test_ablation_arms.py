"""The ablation arms (bench/_ablation_arms.py): a user recipe plus overrides, each override a setting its
service accepts, and within a table the arms differ only in how the demonstrations are used."""

from __future__ import annotations

import pytest

from bench._ablation_arms import RED_CODA, SMOL, SMOL_BUDGET
from launcher.config import StackSettings
from services.trainer.config import TrainerSettings

SFT_KEYS = {
    "CODA_TRAINER_RED__MODE",
    "CODA_TRAINER_SFT_ONLY",
    "CODA_TRAINER_RED__G",
    "CODA_TRAINER_RED__ACCURACY_AWARE",
}


def _settings(arm, monkeypatch) -> tuple[TrainerSettings, StackSettings]:
    for name, value in arm.env.items():
        monkeypatch.setenv(name, value)  # as the services read them: the environment over the recipe
    return TrainerSettings.load(arm.recipe), StackSettings.load(arm.recipe)


@pytest.mark.parametrize("table", [SMOL, RED_CODA], ids=["smol", "red-coda"])
def test_arms_of_a_table_share_a_recipe_and_budget_and_differ_only_in_the_sft_keys(table):
    assert len({arm.recipe for arm in table.values()}) == 1
    budgets = {name: {k: v for k, v in arm.env.items() if k not in SFT_KEYS} for name, arm in table.items()}
    assert len({tuple(sorted(b.items())) for b in budgets.values()}) == 1, budgets


def test_smol_arms(monkeypatch):
    got = {}
    for name, arm in SMOL.items():
        with monkeypatch.context() as m:
            trainer, stack = _settings(arm, m)
            got[name] = (trainer.red.mode, trainer.sft_only)
            assert stack.train_budget_s == float(SMOL_BUDGET["CODA_STACK_TRAIN_BUDGET_S"]) and trainer.max_steps == 1000
    assert got == {
        "grpo": ("grpo_only", False),
        "sft": ("fixed", True),
        "fixed": ("fixed", False),
        "red": ("red", False),
    }


def test_red_coda_arms_and_full_red_is_the_shipped_recipe_at_the_ablation_budget(monkeypatch):
    shipped = TrainerSettings.load("configs/red-coda.toml")
    got = {}
    for name, arm in RED_CODA.items():
        with monkeypatch.context() as m:
            trainer, _ = _settings(arm, m)
            got[name] = (trainer.red.mode, trainer.red.g, trainer.red.accuracy_aware)
            assert (trainer.max_steps, trainer.warmup_steps) == (200, 20) and trainer.sft_data
            if name == "full-red":
                assert (
                    trainer.model_dump()
                    == shipped.model_copy(update={"max_steps": 200, "warmup_steps": 20}).model_dump()
                )
    assert got["grpo"][0] == "grpo_only"
    assert got["fixed-sft"] == ("fixed", 1.0, False)
    assert got["full-red"][0] == "red" and got["full-red"][1] > 1.0 and got["full-red"][2] is True


def test_an_arm_runs_alone_as_its_command_says():
    assert SMOL["sft"].command() == (
        "CODA_TRAINER_RED__MODE=fixed CODA_TRAINER_SFT_ONLY=true CODA_STACK_TRAIN_BUDGET_S=240 "
        "CODA_TRAINER_MAX_STEPS=1000 .venv/bin/python -m launcher train --recipe configs/smol-cpu.toml"
    )
