"""Every shipped recipe loads into the rollout and searcher settings (unknown keys would be errors)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipes import RECIPES
from services.rollout.config import RolloutSettings
from services.searcher.config import SearcherSettings

CONFIGS = sorted((Path(__file__).resolve().parents[3] / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_recipe_loads(path):
    rollout = RolloutSettings.load(recipe=path)
    assert rollout.agent in RECIPES and rollout.budgets()["executor"].max_turns >= 1
    assert SearcherSettings.load(recipe=path).max_turns >= 1
