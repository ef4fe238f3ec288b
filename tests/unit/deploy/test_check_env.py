"""make up stops before compose when .env's model is gated and HF_TOKEN is empty."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("check_env", Path(__file__).parents[3] / "deploy" / "check_env.py")
check_env = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(check_env)


def test_a_gated_model_without_token_stops(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    env = tmp_path / ".env"
    env.write_text("POLICY_MODEL=google/gemma-2-2b   # the default\nHF_TOKEN=\n")
    assert check_env.main([str(env)]) == 1
    assert "HF_TOKEN" in capsys.readouterr().err
    env.write_text("POLICY_MODEL=google/gemma-2-2b\nHF_TOKEN=hf_x\n")
    assert check_env.main([str(env)]) == 0


def test_an_open_model_needs_no_token(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    env = tmp_path / ".env"
    env.write_text("POLICY_MODEL=HuggingFaceTB/SmolLM2-135M-Instruct\nHF_TOKEN=\n")
    assert check_env.main([str(env)]) == 0
