"""Every shipped recipe loads into the rollout and searcher settings (unknown keys would be errors); each agent's
own knobs, defined beside the agent, are a nested table of the rollout's settings (``[rollout.coda]``,
``CODA_ROLLOUT_CODA__…``, ``--coda JSON``) built from the agent list. Their flat spellings of two releases ago
(``[rollout] executor_max_turns``) are unknown keys now."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from agents import AGENTS, AgentParams, agent_params
from agents.coda import CoDAParams
from agents.recursive_reasoner import RecursiveReasonerParams
from agents.search_r1 import SearchR1Params
from agents.single_turn import SingleTurnParams
from agents.tool_agent import ToolAgentParams
from services.rollout.config import RolloutSettings
from services.searcher.config import SearcherSettings

CONFIGS = sorted((Path(__file__).resolve().parents[3] / "configs").glob("*.toml"))

# The agents' knobs each shipped recipe set, as they loaded before the knobs moved into nested tables (computed
# once from the flat-key code; every knob not named here has its default).
BEFORE = {
    "coda": {"executor_max_turns": 2},
    "red-coda": {"executor_max_turns": 2},
    "smol-coda": {"executor_max_turns": 2},
    "smol-coda-2wiki": {"executor_max_turns": 2},
    "smol-coda-hotpotqa": {"executor_max_turns": 2},
    "smol-thinker-2wiki": {"searcher_max_turns": 2},
    "smol-thinker-hotpotqa": {"searcher_max_turns": 2},
    "thinker-searcher": {"searcher_max_turns": 3},
}
DEFAULTS = {
    "searcher_max_turns": None,
    "executor_max_turns": 3,
    "format_weight": 0.1,
    "refine_weight": 0.1,
    "reward_mode": "per_role",
    "fact_weight": 1.0,
    "restate_penalty": 1.0,
    "tool_reward_weights": {"mrr": 1.0, "answer_similarity": 1.0, "format": 1.0},
    "reward_combination": "explicit",
    "worker_max_tokens": 256,
    "token_budget": 1000,
    "stop": [],
}
SEARCHER_SERVED = {"thinker-searcher": "searcher"}  # else "policy", the base model of the policy's server
PARAMS = (SearchR1Params, CoDAParams, ToolAgentParams, RecursiveReasonerParams, SingleTurnParams)


@pytest.fixture
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("CODA_"):
            monkeypatch.delenv(key)
    return monkeypatch


def _knobs(settings: RolloutSettings) -> dict:
    return {k: v for p in PARAMS for k, v in p.of(settings).model_dump().items()}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_recipe_loads(path, clean_env):
    rollout = RolloutSettings.load(recipe=path)
    assert rollout.agent in AGENTS and rollout.budgets()["executor"].max_turns >= 1
    assert SearcherSettings.load(recipe=path).max_turns >= 1
    assert _knobs(rollout) == {**DEFAULTS, **BEFORE.get(path.stem, {})}
    # The served names every recipe set (as [rollout] / [searcher] model_name before the rename).
    assert rollout.served_model_name == "policy"
    assert SearcherSettings.load(recipe=path).served_model_name == SEARCHER_SERVED.get(path.stem, "policy")


def test_every_agents_params_are_a_table_of_the_rollout_settings():
    """A params model next to an agent that the rollout does not hold would be knobs nobody can set."""
    modules = {sys.modules[agent.run.__module__] for agent in AGENTS.values()}
    found = {v for m in modules for v in vars(m).values() if isinstance(v, type) and issubclass(v, AgentParams)}
    assert found - {AgentParams} == set(PARAMS) == set(agent_params().values())
    for table, params in agent_params().items():
        assert RolloutSettings.model_fields[table].annotation is params
        assert isinstance(getattr(RolloutSettings.load(), table), params)


def test_agent_knobs_are_nested_tables(tmp_path, clean_env):
    defaults = RolloutSettings.load()
    assert CoDAParams.of(defaults) == CoDAParams() and ToolAgentParams.of(defaults) == ToolAgentParams()
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        '[rollout]\nagent = "coda"\n[rollout.coda]\nformat_weight = 0.3\nexecutor_max_turns = 5\n'
        '[rollout.single_turn]\nstop = ["END"]\n'
    )
    clean_env.setenv("CODA_ROLLOUT_TOOL_AGENT__REWARD_COMBINATION", "std")
    settings = RolloutSettings.load(recipe=recipe, recursive_reasoner={"token_budget": 50})
    assert settings.coda == CoDAParams(format_weight=0.3, executor_max_turns=5)
    assert settings.budgets()["executor"].max_turns == 5
    assert settings.tool_agent.reward_combination == "std"
    assert settings.recursive_reasoner.token_budget == 50 and settings.single_turn.stop == ["END"]
    with pytest.raises(ValueError, match="format_wieght"):
        RolloutSettings.load(coda={"format_wieght": 0.3})


def test_the_old_flat_keys_are_gone(tmp_path, clean_env):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[rollout]\nagent = "coda"\nexecutor_max_turns = 5\n')
    with pytest.raises(ValueError, match="executor_max_turns"):
        RolloutSettings.load(recipe=recipe)
    with pytest.raises(ValueError, match="format_weight"):
        RolloutSettings.load(format_weight=0.3)
    clean_env.setenv("CODA_ROLLOUT_EXECUTOR_MAX_TURNS", "2")  # an unknown variable: not read
    assert RolloutSettings.load().coda.executor_max_turns == CoDAParams().executor_max_turns
    assert RolloutSettings.moved_keys == {"model_name": "served_model_name"}  # a renamed key, warned


def test_each_place_keeps_its_precedence_in_the_tables(tmp_path, clean_env):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[rollout.coda]\nexecutor_max_turns = 5\nformat_weight = 0.3\n")
    clean_env.setenv("CODA_ROLLOUT_CODA__EXECUTOR_MAX_TURNS", "2")  # the variable beats the recipe's table
    settings = RolloutSettings.load(recipe=recipe, coda={"format_weight": 0.7})  # the command line beats both
    assert (settings.coda.executor_max_turns, settings.coda.format_weight) == (2, 0.7)


def test_flags_reach_the_nested_tables(clean_env):
    import argparse

    parser = argparse.ArgumentParser()
    RolloutSettings.add_arguments(parser)
    args = parser.parse_args(["--coda", '{"executor_max_turns": 4}', "--tool-agent", '{"reward_combination": "l2"}'])
    settings = RolloutSettings.from_args(args)
    assert settings.coda.executor_max_turns == 4 and settings.tool_agent.reward_combination == "l2"
    with pytest.raises(SystemExit):
        parser.parse_args(["--executor-max-turns", "4"])


@pytest.mark.parametrize("cls", [RolloutSettings, SearcherSettings])
def test_model_name_is_now_served_model_name_with_a_warning(cls, tmp_path, clean_env, caplog):
    import logging

    section, prefix = cls.toml_section, cls.model_config["env_prefix"]
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[shared]\nserved_model_name = "shared"\n[{section}]\nmodel_name = "old"\n')

    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "shared.settings" and r.levelno == logging.WARNING]

    assert cls.load(recipe=recipe).served_model_name == "old"  # its own table beats [shared], either spelling
    assert warned() == [
        f"recipe {recipe}: [{section}] model_name is now [{section}] served_model_name; the old key goes in the "
        "next release"
    ]
    clean_env.setenv(f"{prefix}MODEL_NAME", "env")
    assert cls.load(recipe=recipe).served_model_name == "env"
    assert any(f"the environment: {prefix}MODEL_NAME is now {prefix}SERVED_MODEL_NAME" in w for w in warned())
    assert cls.load(model_name="flag").served_model_name == "flag"
    assert any("the command line: --model-name is now --served-model-name" in w for w in warned())
    recipe.write_text(f'[{section}]\nmodel_name = "old"\nserved_model_name = "new"\n')
    with pytest.raises(ValueError, match=f"sets \\[{section}\\] model_name and \\[{section}\\] served_model_name"):
        cls.load(recipe=recipe)
