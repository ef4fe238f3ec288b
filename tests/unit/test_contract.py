"""The pipeline contract (shared/contract.py) is defined once and every service sees the same one: each shipped
recipe gives the rollout, the trainer and the inference server's served name the same values, and the
services' fields are the contract's own (type, default, constraints, description)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.inference.config import InferenceSettings
from services.rollout.config import RolloutSettings
from services.trainer.config import TrainerSettings
from shared.contract import PipelineContract, contract_names, mismatch_message
from shared.settings import SHARED_KEYS

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml"))
HOLDERS = (RolloutSettings, TrainerSettings)  # the services that hold (and announce) the whole contract


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch):
    for key in [k for k in os.environ if k.startswith("CODA_")]:
        monkeypatch.delenv(key)


def contract_views(recipe: Path | None) -> dict[str, dict[str, object]]:
    """Each service's view of the contract fields it holds, keyed by the contract's names."""
    views = {cls.__name__: cls.load(recipe).contract_values() for cls in HOLDERS}
    inference = InferenceSettings.load(recipe)
    # The name the inference server answers to: its served_model_name, else the model path (vLLM's rule).
    views["InferenceSettings"] = {"served_model_name": inference.served_model_name or inference.model}
    return views


def disagreements(recipe: Path | None) -> dict[str, dict[str, object]]:
    """Contract field → {service: value} for every field the services do not see alike."""
    by_field: dict[str, dict[str, object]] = {}
    for service, values in contract_views(recipe).items():
        for name, value in values.items():
            by_field.setdefault(name, {})[service] = value
    return {name: seen for name, seen in by_field.items() if len(set(seen.values())) > 1}


@pytest.mark.parametrize("recipe", CONFIGS, ids=lambda p: p.stem)
def test_every_service_of_a_shipped_recipe_sees_the_same_contract(recipe):
    assert disagreements(recipe) == {}
    assert RolloutSettings.load(recipe).contract() == TrainerSettings.load(recipe).contract()


def test_a_recipe_overriding_the_shared_value_in_one_service_is_caught(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        '[shared]\nserved_model_name = "policy"\ngroups_per_step = 2\nadmission_key = "a:mark"\n'
        "[trainer]\ngroups_per_step = 3\n"
    )
    assert disagreements(recipe) == {"groups_per_step": {"RolloutSettings": 2, "TrainerSettings": 3}}
    # [shared] reaches every holder, the admission key included (it was not a [shared] key before).
    assert {cls.load(recipe).contract().admission_key for cls in HOLDERS} == {"a:mark"}


def test_with_no_recipe_the_defaults_agree():
    """The defect this fixes: groups_per_step defaulted to 4 in the rollout and 8 in the trainer. (The
    inference server's own default name is its model path, as vLLM's is: a recipe names it, and the test
    above holds every shipped one to the same name.)"""
    assert RolloutSettings.load().contract() == TrainerSettings.load().contract() == PipelineContract()
    assert set(disagreements(None)) == {"served_model_name"}


@pytest.mark.parametrize("cls", HOLDERS, ids=lambda c: c.__name__)
def test_the_services_fields_are_the_contracts_own(cls):
    assert set(cls.contract_fields) == set(PipelineContract.model_fields)
    for name, own in cls.contract_fields.items():
        theirs, mine = PipelineContract.model_fields[name], cls.model_fields[own]
        assert mine.annotation == theirs.annotation, (cls.__name__, own)
        assert (mine.default, mine.description, mine.metadata) == (theirs.default, theirs.description, theirs.metadata)
        assert cls.shared_keys[name] == own, f"[shared] {name} must reach {cls.__name__}.{own}"
    assert set(PipelineContract.model_fields) <= SHARED_KEYS


def test_env_vars_keep_their_service_names(monkeypatch):
    monkeypatch.setenv("CODA_TRAINER_GROUPS_PER_STEP", "7")
    monkeypatch.setenv("CODA_ROLLOUT_SERVED_MODEL_NAME", "other")
    monkeypatch.setenv("CODA_TRAINER_SERVED_MODEL", "other")  # the old name: still read, with a warning
    assert TrainerSettings.load().contract().groups_per_step == 7
    assert RolloutSettings.load().contract().groups_per_step == 4
    assert disagreements(None) == {
        "groups_per_step": {"RolloutSettings": 4, "TrainerSettings": 7},  # only the trainer's was overridden
        "served_model_name": {
            "RolloutSettings": "other",
            "TrainerSettings": "other",
            "InferenceSettings": "runs/tiny-model",
        },
    }


def test_a_service_holding_part_of_the_contract_has_no_whole_one():
    with pytest.raises(TypeError, match="only part of the pipeline contract"):
        InferenceSettings.load().contract()
    with pytest.raises(ValueError, match="not pipeline contract fields"):
        contract_names(model_nmae="x")


def test_the_refusal_names_each_field_with_both_values():
    message = mismatch_message("trainer", "rollout", [("groups_per_step", 8, 4), ("temperature", 0.9, 1.0)])
    assert "groups_per_step = 8 here, 4 announced" in message and "temperature = 0.9 here, 1.0 announced" in message
    assert "the rollout announced" in message and "redis-cli DEL pipeline:contract" in message
