"""Trainer settings: every shipped recipe's [trainer] table loads; bad combinations are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from services.trainer.config import TrainerSettings

CONFIGS = sorted((Path(__file__).resolve().parents[3] / "configs").glob("*.toml"))


@pytest.mark.parametrize("recipe", CONFIGS, ids=lambda p: p.name)
def test_recipes_load(recipe):
    s = TrainerSettings.load(recipe=recipe)
    assert s.groups_per_step >= 1 and s.zero_stage in (0, 1, 2, 3)


def test_invalid_combinations_refused():
    with pytest.raises(ValidationError, match="dual_clip"):
        TrainerSettings(dual_clip=0.5)
    with pytest.raises(ValidationError, match="LoRA with ZeRO-3"):
        TrainerSettings(finetune="lora", zero_stage=3)
    with pytest.raises(ValidationError):
        TrainerSettings(unknown_key=1)


def test_env_overrides_recipe(monkeypatch):
    monkeypatch.setenv("CODA_TRAINER_LR", "0.5")
    assert TrainerSettings.load(recipe=CONFIGS[0]).lr == 0.5


def test_zero_advantage_defaults_to_skip_and_reads_the_older_key(tmp_path):
    assert TrainerSettings().zero_advantage == "skip"
    assert TrainerSettings(skip_zero_advantage=True).zero_advantage == "drop"
    assert TrainerSettings(skip_zero_advantage=False).zero_advantage == "train"
    recipe = tmp_path / "r.toml"
    recipe.write_text("[trainer]\nskip_zero_advantage = true\n")
    assert TrainerSettings.load(recipe=recipe).zero_advantage == "drop"
    with pytest.raises(ValidationError):
        TrainerSettings(zero_advantage="sometimes")


def test_server_check_s_is_refused_with_the_reason(tmp_path):
    """The trainer no longer loads weights into a server, a restarted one included: the key is gone."""
    recipe = tmp_path / "r.toml"
    recipe.write_text("[trainer]\nserver_check_s = 2.0\n")
    with pytest.raises(ValidationError, match="server_check_s was removed: the trainer no longer loads weights"):
        TrainerSettings.load(recipe=recipe)
    assert TrainerSettings().sync_wait_s == 60.0
