"""deploy/vllm/check_weight_sync.py against our CPU server (it speaks vLLM's API): every step passes, and a
server holding other weights than the check is told is caught."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from services.inference.config import InferenceSettings
from shared.redis_server import free_port
from testing.local_inference import serve_in_thread
from tests.integration.inference.conftest import server_settings

REPO = Path(__file__).resolve().parents[3]


def test_every_step_matches_the_forward_pass(tmp_path, tiny_model, weights_root, perturbed, lora_adapter):
    settings = server_settings(tiny_model, weights_root)
    out = tmp_path / "sync.json"
    with serve_in_thread(settings) as url:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "deploy.vllm.check_weight_sync",
                "--url",
                url,
                "--model",
                str(tiny_model),
                "--weights",
                str(perturbed[0]),
                "--adapter",
                str(lora_adapter[0]),
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["step"] for r in rows] == ["base", "reload", "lora", "restore"]
    assert all(r["ok"] and r["tokens"] == 32 and r["max_abs_diff"] < 1e-4 for r in rows)
    assert rows[-1]["same_tokens_as_base"]


def test_serving_other_weights_than_claimed_fails(tmp_path, tiny_model, weights_root, perturbed):
    """The server holds the base weights while the check is told it holds the perturbed ones: caught."""
    claimed = weights_root / "claimed"
    shutil.copytree(tiny_model, claimed)
    shutil.copy(perturbed[0] / "model.safetensors", claimed / "model.safetensors")
    settings = InferenceSettings(
        model=str(tiny_model), served_model_name="policy", port=free_port(), weights_root=str(weights_root)
    )
    out = tmp_path / "sync.json"
    with serve_in_thread(settings) as url:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "deploy.vllm.check_weight_sync",
                "--url",
                url,
                "--model",
                str(claimed),
                "--weights",
                str(perturbed[0]),
                "--max-tokens",
                "8",
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
    assert run.returncode == 1, run.stdout + run.stderr
    rows = {r["step"]: r for r in json.loads(out.read_text())["rows"]}
    assert not rows["base"]["ok"] and rows["base"]["max_abs_diff"] > 1e-2
    assert rows["reload"]["ok"]  # after a real reload the server does hold what it is compared against
