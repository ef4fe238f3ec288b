"""The pipeline contract announced in a real Redis: the same contract announced again passes (a restart, a
replica), a differing one is refused with each field named, and real services refuse to start against it:
a trainer process started with an override the running rollout did not get, and a second rollout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.rollout.app import build_app
from services.rollout.config import RolloutSettings
from shared.contract import CONTRACT_KEY, ContractMismatch, PipelineContract, announce, clear
from shared.redis_server import free_port
from testing.serving import ThreadedServer

REPO = Path(__file__).resolve().parents[2]


def _with(contract: PipelineContract, **changes) -> PipelineContract:
    return PipelineContract(**{**contract.model_dump(), **changes})


def test_the_same_contract_passes_and_a_differing_one_is_refused_naming_each_field(redis_client):
    contract = PipelineContract(groups_per_step=2)
    announce(redis_client, contract, "trainer")
    announce(redis_client, contract, "rollout")  # the rollout of the same recipe
    announce(redis_client, contract, "trainer")  # the trainer restarted
    with pytest.raises(ContractMismatch) as refused:
        announce(redis_client, _with(contract, groups_per_step=8, temperature=0.7), "rollout")
    message = str(refused.value)
    assert "groups_per_step = 8 here, 2 announced" in message and "temperature = 0.7 here, 1.0 announced" in message
    assert "the trainer announced" in message and "max_staleness" not in message
    assert json.loads(redis_client.hget(CONTRACT_KEY, "groups_per_step")) == 2  # the refused one changed nothing
    clear(redis_client)  # a deliberate change of recipe on the same Redis
    announce(redis_client, _with(contract, groups_per_step=8), "rollout")
    with pytest.raises(ContractMismatch, match="groups_per_step = 2 here, 8 announced"):
        announce(redis_client, contract, "trainer")


def test_an_announcement_from_before_a_field_existed_is_completed_not_refused(redis_client):
    announce(redis_client, PipelineContract(), "trainer")
    redis_client.hdel(CONTRACT_KEY, "published_key")  # as announced by a version without that field
    announce(redis_client, PipelineContract(published_key="run2:published"), "rollout")
    with pytest.raises(ContractMismatch, match="published_key = 'rollout:published' here, 'run2:published'"):
        announce(redis_client, PipelineContract(), "trainer")


def _rollout(redis_url: str, **overrides) -> RolloutSettings:
    # single-turn needs no retriever; the inference server is absent: the rollout starts and fails its groups
    # (counted, retried later), which is all these tests need of it.
    base = dict(
        agent="single-turn",
        tokenizer="char",
        dataset="bundled:lookup",
        redis_url=redis_url,
        inference_url=f"http://127.0.0.1:{free_port()}",
        retry_attempts=1,
        groups_per_step=2,
        max_staleness=0,
    )
    return RolloutSettings.load(**{**base, **overrides})


def _trainer(tmp_path: Path, redis_url: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CODA_", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    command = [sys.executable, "-m", "services.trainer", "train", "--redis-url", redis_url, "--port", "0"]
    # No model there: a trainer that got past the contract would fail later, on loading it, and say so.
    command += ["--model", str(tmp_path / "no-model"), "--log-dir", str(tmp_path / "logs"), *args]
    command += ["--checkpoint-dir", str(tmp_path / "ckpt"), "--weights-dir", str(tmp_path / "w")]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


async def test_services_with_differing_contracts_refuse_to_start(tmp_path, redis_server, redis_client):
    rollout = _rollout(redis_server.url)
    with ThreadedServer(build_app(rollout)):
        announced = {k.decode(): v.decode() for k, v in redis_client.hgetall(CONTRACT_KEY).items()}
        assert announced.pop("_announced_by") == "rollout"
        assert PipelineContract(**{k: json.loads(v) for k, v in announced.items()}) == rollout.contract()
        # The trainer of the same recipe, but the rollout's groups_per_step = 2 never reached it (default 4).
        refused = _trainer(tmp_path, redis_server.url, "--max-staleness", "0")
        assert refused.returncode == 1, refused.stderr[-3000:]
        assert "ContractMismatch" in refused.stderr and "groups_per_step = 4 here, 2 announced" in refused.stderr
        assert "the rollout announced" in refused.stderr and "max_staleness =" not in refused.stderr
        # A second rollout replica of the same recipe starts; one at another temperature does not.
        with ThreadedServer(build_app(_rollout(redis_server.url))):
            pass
        hot = build_app(_rollout(redis_server.url, temperature=0.5))
        with pytest.raises(ContractMismatch, match=r"temperature = 0\.5 here, 1\.0 announced"):
            async with hot.router.lifespan_context(hot):
                pass
    # The trainer that agrees gets past the contract, to the next thing it needs: its model.
    agreeing = _trainer(tmp_path, redis_server.url, "--max-staleness", "0", "--groups-per-step", "2")
    assert agreeing.returncode != 0 and "ContractMismatch" not in agreeing.stderr
    assert "no-model" in agreeing.stderr


def test_make_train_forgets_the_announcement_when_it_starts_the_trainer_and_rollout(
    tmp_path, redis_server, redis_client
):
    from launcher.config import StackSettings
    from launcher.train import LocalStack

    recipe = str(REPO / "configs" / "tiny-cpu.toml")
    stack = LocalStack(recipe, StackSettings.load(recipe, run_root=str(tmp_path)), run=tmp_path / "run")
    stack.ports.redis = redis_server.port
    announce(redis_client, PipelineContract(groups_per_step=9), "trainer")  # a start of this run before an edit
    stack.processes.forget_contract()
    assert not redis_client.exists(CONTRACT_KEY)
