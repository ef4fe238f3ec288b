"""deploy/vllm/record_fixtures.py against our CPU server (it speaks vLLM's API): every current fixture is
captured, and the captured bodies pass the same contract suite as the shipped fixtures."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from testing.local_inference import serve_in_thread
from tests.integration.inference.conftest import server_settings

REPO = Path(__file__).resolve().parents[3]
CURRENT = [
    "admin.json",
    "completion_eos_and_stop_token.json",
    "completion_stop_and_length.json",
    "errors.json",
    "models.json",
]


def test_recorder_captures_every_current_fixture_and_they_pass_the_contract_suite(
    tmp_path, tiny_model, weights_root, lora_dir_for_contract
):
    out = tmp_path / "fixtures"
    shutil.copytree(REPO / "tests" / "fixtures" / "vllm", out)
    before = {name: (out / name).read_text() for name in os.listdir(out)}
    # Its own server: the recorder reloads weights (version 7), which other tests' server must not see.
    settings = server_settings(tiny_model, weights_root)
    with serve_in_thread(settings) as url:
        run = subprocess.run(
            [
                sys.executable,
                str(REPO / "deploy" / "vllm" / "record_fixtures.py"),
                "--url",
                url,
                "--out",
                str(out),
                "--adapter",
                str(lora_dir_for_contract),
                "--weights",
                str(tiny_model),
                "--prompt-ids",
                "5,17,300,42,9",
                "--prompt-text",
                "unused",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
        partial = tmp_path / "partial"
        shutil.copytree(REPO / "tests" / "fixtures" / "vllm", partial)
        short = subprocess.run(
            [
                sys.executable,
                str(REPO / "deploy" / "vllm" / "record_fixtures.py"),
                "--url",
                url,
                "--out",
                str(partial),
                "--prompt-ids",
                "5,17,300,42,9",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
    # Without an adapter and weights it says what it could not capture, keeps the old bodies, and exits 1.
    assert short.returncode == 1 and "not captured: models.json, admin.json LoRA routes" in short.stdout
    assert "not captured: admin.json collective_rpc: pass --weights" in short.stdout
    assert (
        json.loads((partial / "admin.json").read_text())["collective_rpc"]
        == json.loads(before["admin.json"])["collective_rpc"]
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "not captured" not in run.stdout
    for name in CURRENT:
        data = json.loads((out / name).read_text())
        assert data["source"].startswith(f"captured from a live server ({url}"), name
        assert (out / name).read_text() != before[name], name
    assert (out / "completion_legacy_no_token_ids.json").read_text() == before["completion_legacy_no_token_ids.json"]
    models = json.loads((out / "models.json").read_text())["response"]["data"]
    assert [m["id"] for m in models] == ["policy", "policy-v3"] and models[1]["parent"] == "policy"
    suite = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/inference/test_vllm_contract.py"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "CODA_VLLM_FIXTURES": str(out)},
    )
    assert suite.returncode == 0, suite.stdout[-3000:]
