"""Trainer settings: every shipped recipe's [trainer] table loads, its nested tables (``[trainer.lora]``, …) to
recorded values; the flat keys of the release before still set them, with a warning naming the new key; bad
combinations are refused."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.trainer.config import MOVED, TrainerSettings

CONFIGS = sorted((Path(__file__).resolve().parents[3] / "configs").glob("*.toml"))
SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Every nested table's values by default, written out (a changed default shows here).
TABLE_DEFAULTS = {
    "lora": {"rank": 16, "alpha": 32, "dropout": 0.0, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"], "layers": 0},
    "importance": {"mode": "none", "cap": 2.0, "seq_min": 0.5, "seq_max": 2.0},
    "red": {
        "mode": "red",
        "g": 5.0,
        "ema_decay": 0.99,
        "delta": "relative",
        "accuracy_aware": True,
        "accuracy_key": "f1",
        "accuracy_threshold": 0.0,
        "floor": None,
    },
    "sync": {"check": False, "wait_s": 60.0, "prompt": None, "tokens": 16, "tolerance": 0.5},
    "wandb": {"project": None, "mode": "offline"},
}
# What each shipped recipe's tables hold apart from the defaults, as they loaded from the flat keys before the
# tables (computed once from that code; red-coda's [trainer.red] and the rank/alpha lines restate defaults).
RECIPE_TABLES = {
    "recursive-reasoner": {"lora": {"dropout": 0.05, "targets": SEVEN}},
    "smol-2wiki": {"lora": {"targets": SEVEN}},
    "smol-coda": {"lora": {"targets": SEVEN}},
    "smol-coda-2wiki": {"lora": {"targets": SEVEN}},
    "smol-coda-hotpotqa": {"lora": {"targets": SEVEN}},
    "smol-cpu": {"lora": {"targets": SEVEN}},
    "smol-hotpotqa": {"lora": {"targets": SEVEN}},
    "smol-thinker-2wiki": {"lora": {"targets": SEVEN}},
    "smol-thinker-hotpotqa": {"lora": {"targets": SEVEN}},
    "tool-agent": {"lora": {"alpha": 16, "dropout": 0.1, "targets": SEVEN}},
}


@pytest.fixture
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("CODA_"):
            monkeypatch.delenv(key)
    return monkeypatch


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "shared.settings" and r.levelno == logging.WARNING]


@pytest.mark.parametrize("recipe", CONFIGS, ids=lambda p: p.stem)
def test_recipes_nested_tables_hold_the_recorded_values_without_a_warning(recipe, clean_env, caplog):
    s = TrainerSettings.load(recipe=recipe)
    got = {table: getattr(s, table).model_dump() for table in TABLE_DEFAULTS}
    recorded = RECIPE_TABLES.get(recipe.stem, {})
    assert got == {table: {**values, **recorded.get(table, {})} for table, values in TABLE_DEFAULTS.items()}
    assert _warnings(caplog) == [], "a shipped recipe uses a flat key of the release before"
    assert (s.finetune == "lora") == (recipe.stem in RECIPE_TABLES)
    assert s.served_model_name == "policy"  # every shipped recipe's ([shared] served_model_name)


def test_every_old_flat_key_names_its_table_and_key():
    assert len(MOVED) == sum(len(v) for v in TABLE_DEFAULTS.values()) + 1 == 25
    assert MOVED["served_model"] == "served_model_name"  # a renamed key, not a table's
    assert MOVED["lora_rank"] == "lora.rank" and MOVED["is_seq_max"] == "importance.seq_max"
    assert MOVED["red_accuracy_aware"] == "red.accuracy_aware" and MOVED["sync_check"] == "sync.check"
    assert MOVED["wandb_project"] == "wandb.project"


def test_nested_tables_from_the_recipe_the_environment_and_the_command_line(tmp_path, clean_env, caplog):
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        '[trainer]\nfinetune = "lora"\n[trainer.lora]\nrank = 8\nalpha = 8\n[trainer.red]\nmode = "fixed"\n'
    )
    clean_env.setenv("CODA_TRAINER_LORA__ALPHA", "4")  # the environment beats the recipe, key by key
    clean_env.setenv("CODA_TRAINER_SYNC__CHECK", "true")
    s = TrainerSettings.load(recipe=recipe, importance={"mode": "token"}, red={"g": 2.0})
    assert (s.lora.rank, s.lora.alpha, s.sync.check) == (8, 4, True)
    assert (s.importance.mode, s.red.mode, s.red.g) == ("token", "fixed", 2.0)
    assert _warnings(caplog) == []
    with pytest.raises(ValidationError, match="rnak"):
        TrainerSettings.load(lora={"rnak": 8})


def test_old_flat_keys_still_set_the_tables_with_a_warning_naming_the_new_key(tmp_path, clean_env, caplog):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[trainer]\nlora_rank = 8\nred_mode = "fixed"\n[trainer.lora]\nalpha = 8\n')
    clean_env.setenv("CODA_TRAINER_IS_MODE", "token")
    s = TrainerSettings.load(recipe=recipe, sync_tokens=4)
    assert (s.lora.rank, s.lora.alpha, s.red.mode, s.importance.mode, s.sync.tokens) == (8, 8, "fixed", "token", 4)
    warned = _warnings(caplog)
    assert (
        f"recipe {recipe}: [trainer] lora_rank is now [trainer.lora] rank; the old key goes in the next release"
        in warned
    )
    assert any("[trainer] red_mode is now [trainer.red] mode" in w for w in warned)
    assert any("the environment: CODA_TRAINER_IS_MODE is now CODA_TRAINER_IMPORTANCE__MODE" in w for w in warned)
    assert any("the command line: --sync-tokens is now --sync" in w for w in warned)
    assert len(warned) == 4


def test_each_place_keeps_its_precedence_across_the_two_spellings(tmp_path, clean_env, caplog):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[trainer.lora]\nrank = 8\nalpha = 8\n")
    clean_env.setenv("CODA_TRAINER_LORA_RANK", "4")  # the old variable beats the recipe's new table
    s = TrainerSettings.load(recipe=recipe, lora_alpha=2)  # the command line beats both
    assert (s.lora.rank, s.lora.alpha) == (4, 2)


def test_one_place_setting_both_spellings_is_an_error_naming_both(tmp_path, clean_env):
    both = tmp_path / "both.toml"
    both.write_text("[trainer]\nlora_rank = 4\n[trainer.lora]\nrank = 8\n")
    with pytest.raises(
        ValueError, match=r"sets \[trainer\] lora_rank and \[trainer.lora\] rank.*keep \[trainer.lora\] rank"
    ):
        TrainerSettings.load(recipe=both)
    clean_env.setenv("CODA_TRAINER_RED_G", "2")
    clean_env.setenv("CODA_TRAINER_RED__G", "3")
    with pytest.raises(ValueError, match="the environment sets CODA_TRAINER_RED_G and CODA_TRAINER_RED__G"):
        TrainerSettings.load()
    clean_env.delenv("CODA_TRAINER_RED_G")
    with pytest.raises(ValueError, match="the command line sets --sync-check and --sync"):
        TrainerSettings.load(sync_check=True, sync={"check": False})


def test_old_and_new_flags(clean_env, caplog):
    parser = argparse.ArgumentParser()
    TrainerSettings.add_arguments(parser)
    args = parser.parse_args(["--lora", '{"rank": 4}', "--red-g", "2.0", "--wandb-mode", "online"])
    s = TrainerSettings.from_args(args)
    assert (s.lora.rank, s.red.g, s.wandb.mode) == (4, 2.0, "online")
    assert len(_warnings(caplog)) == 2


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
    assert TrainerSettings().sync.wait_s == 60.0


def test_served_model_is_now_served_model_name_with_a_warning(tmp_path, clean_env, caplog):
    recipe = tmp_path / "r.toml"
    # The old key in [trainer] still beats [shared]'s new one, as the new key in [trainer] would.
    recipe.write_text('[shared]\nserved_model_name = "shared"\n[trainer]\nserved_model = "old"\n')
    assert TrainerSettings.load(recipe=recipe).served_model_name == "old"
    assert _warnings(caplog) == [
        f"recipe {recipe}: [trainer] served_model is now [trainer] served_model_name; the old key goes in the next "
        "release"
    ]
    caplog.clear()
    clean_env.setenv("CODA_TRAINER_SERVED_MODEL", "env")
    assert TrainerSettings.load(recipe=recipe).served_model_name == "env"
    assert any("CODA_TRAINER_SERVED_MODEL is now CODA_TRAINER_SERVED_MODEL_NAME" in w for w in _warnings(caplog))
    assert TrainerSettings.load(recipe=recipe, served_model="flag").served_model_name == "flag"
    assert any("--served-model is now --served-model-name" in w for w in _warnings(caplog))
    with pytest.raises(ValueError, match="sets CODA_TRAINER_SERVED_MODEL and CODA_TRAINER_SERVED_MODEL_NAME"):
        clean_env.setenv("CODA_TRAINER_SERVED_MODEL_NAME", "both")
        TrainerSettings.load()
