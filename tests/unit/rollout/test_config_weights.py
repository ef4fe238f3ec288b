"""The rollout's weight settings: ``sync_weights`` is gone with an error that says why (it could turn the only
loading of weights into servers off), from a recipe and from a keyword alike."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.rollout.config import RolloutSettings


@pytest.mark.parametrize("value", ["true", "false"])
def test_sync_weights_is_refused_with_the_reason(tmp_path, value):
    recipe = tmp_path / "r.toml"
    recipe.write_text(f"[rollout]\nsync_weights = {value}\n")
    with pytest.raises(ValidationError, match="sync_weights was removed: the rollout's fleet watch alone loads"):
        RolloutSettings.load(recipe=recipe)
    with pytest.raises(ValidationError, match="cannot be turned off"):
        RolloutSettings(sync_weights=False)
    assert RolloutSettings().keep_adapters == 3
