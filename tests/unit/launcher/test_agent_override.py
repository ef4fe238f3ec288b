"""``make train`` reads the agent as the rollout will, through its settings: ``CODA_ROLLOUT_AGENT`` overrides the
recipe's ``[rollout] agent`` for the launcher too (which servers it starts, which demonstrations it makes),
not only for the rollout it launches."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config import StackSettings
from launcher.train import LocalStack

RECIPE = str(Path(__file__).resolve().parents[3] / "configs" / "tiny-cpu.toml")  # [rollout] agent = "search-r1"


def _stack(tmp_path) -> LocalStack:
    return LocalStack(RECIPE, StackSettings.load(RECIPE, run_root=str(tmp_path)), run=tmp_path / "run")


def test_the_recipes_agent_without_an_override(tmp_path, monkeypatch):
    monkeypatch.delenv("CODA_ROLLOUT_AGENT", raising=False)
    stack = _stack(tmp_path)
    assert stack.agent == "search-r1" and stack.retrieves and stack.demonstrations == "search"


def test_the_launcher_honours_coda_rollout_agent(tmp_path, monkeypatch):
    monkeypatch.setenv("CODA_ROLLOUT_AGENT", "single-turn")
    stack = _stack(tmp_path)
    # single-turn never searches and has no demonstrations: no index to build, no retriever, no make-sft.
    assert stack.agent == "single-turn" and not stack.retrieves and stack.demonstrations is None


def test_an_unknown_agent_in_the_environment_stops_the_launcher(tmp_path, monkeypatch):
    monkeypatch.setenv("CODA_ROLLOUT_AGENT", "no-such-agent")
    with pytest.raises(ValueError, match="no-such-agent"):
        _stack(tmp_path)
