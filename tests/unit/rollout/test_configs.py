"""Every shipped recipe loads into the rollout and searcher settings (unknown keys would be errors), and each
agent's own knobs, defined beside the agent, are still flat ``[rollout]`` keys and ``CODA_ROLLOUT_`` variables."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from recipes import AGENTS, AgentParams
from recipes.coda import CoDAParams
from recipes.recursive_reasoner import RecursiveReasonerParams
from recipes.single_turn import SingleTurnParams
from recipes.tool_agent import ToolAgentParams
from services.rollout.config import RolloutSettings
from services.searcher.config import SearcherSettings

CONFIGS = sorted((Path(__file__).resolve().parents[3] / "configs").glob("*.toml"))


@pytest.fixture
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("CODA_"):
            monkeypatch.delenv(key)
    return monkeypatch


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_recipe_loads(path):
    rollout = RolloutSettings.load(recipe=path)
    assert rollout.agent in AGENTS and rollout.budgets()["executor"].max_turns >= 1
    assert SearcherSettings.load(recipe=path).max_turns >= 1


def test_every_agents_params_are_rollout_settings():
    """A params model next to an agent that the rollout does not inherit would be knobs nobody can set."""
    modules = {sys.modules[agent.run.__module__] for agent in AGENTS.values()}
    found = {v for m in modules for v in vars(m).values() if isinstance(v, type) and issubclass(v, AgentParams)}
    params = found - {AgentParams}
    assert {CoDAParams, ToolAgentParams, RecursiveReasonerParams, SingleTurnParams} <= params
    assert all(issubclass(RolloutSettings, p) for p in params)


def test_agent_knobs_keep_their_flat_keys(tmp_path, clean_env):
    defaults = RolloutSettings.load()
    assert CoDAParams.of(defaults) == CoDAParams() and ToolAgentParams.of(defaults) == ToolAgentParams()
    recipe = tmp_path / "r.toml"
    recipe.write_text('[rollout]\nagent = "coda"\nformat_weight = 0.3\nexecutor_max_turns = 5\nstop = ["END"]\n')
    clean_env.setenv("CODA_ROLLOUT_REWARD_COMBINATION", "std")
    settings = RolloutSettings.load(recipe=recipe, token_budget=50)
    assert CoDAParams.of(settings) == CoDAParams(format_weight=0.3, executor_max_turns=5)
    assert settings.budgets()["executor"].max_turns == 5
    assert ToolAgentParams.of(settings).reward_combination == "std"
    assert RecursiveReasonerParams.of(settings).token_budget == 50
    assert SingleTurnParams.of(settings).stop == ["END"]
    with pytest.raises(ValueError, match="format_wieght"):
        RolloutSettings.load(format_wieght=0.3)
