"""Adapter names are unique to a run (``<served>-<run>-vN``): a real server that still holds run A's adapters
after Redis was wiped never serves them to run B. B's v1..vN are loaded fresh (A's ``v1`` is not taken for
B's), A's adapters are unloaded, and B's requests get B's weights.

The trainer's side is its real ``Publisher`` (the run id in Redis, the announcing transaction) with the
folder write replaced by a copy of a prepared adapter; the rollout's side is its real ``WeightSync``
(follower + fleet watch) against the real inference server of the tiny model."""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest

from agents.core.llm import PolicyState
from services.rollout.config import RolloutSettings
from services.rollout.fleet import normalize
from services.rollout.weight_sync import WeightSync
from services.trainer import publish
from shared.inference_client import InferenceError
from shared.inference_sync import SyncInferenceClient
from shared.protocol import parse_adapter_name
from tests.integration.inference.conftest import max_diff, server_settings

PROMPT = [5, 17, 300, 42, 9, 77]


@pytest.fixture
def server(tiny_model, weights_root):
    from testing.local_inference import serve_in_thread

    with serve_in_thread(server_settings(tiny_model, weights_root, max_loras=3)) as url:
        yield url


def _publisher(monkeypatch, redis_client, root, adapter) -> publish.Publisher:
    """The trainer's publisher; its weights are ``adapter``'s (the same folder for every version)."""

    def write(engine, folder_root, version, kind):
        path = folder_root / publish.folder_name(version, kind)
        shutil.rmtree(path, ignore_errors=True)
        shutil.copytree(adapter, path)
        return path

    monkeypatch.setattr(publish, "write_weights", write)
    return publish.Publisher(None, str(root), "lora", redis_client, "weights", "policy:version", keep=5)


async def _until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def _served(url: str) -> set[str]:
    with SyncInferenceClient(url) as client:
        return {card.id for card in client.models()}


def test_a_new_run_after_a_redis_wipe_never_serves_the_old_runs_adapters(
    server, weights_root, lora_adapter, lora_dir_for_contract, redis_server, redis_client, monkeypatch
):
    adapter_a, _ = lora_adapter  # a real perturbation
    adapter_b = lora_dir_for_contract  # zero B: the base model's outputs
    settings = RolloutSettings(
        inference_url=server,
        redis_url=redis_server.url,
        servers_key="",
        fleet_probe_s=0.2,
        keep_adapters=2,
        served_model_name="policy",
    )

    async def run(pub: publish.Publisher, versions: range, *, before=None) -> tuple[WeightSync, PolicyState]:
        """Publish ``versions`` (the first before the rollout starts), the rollout following them."""
        state = PolicyState(model_name="policy", served_model_name="policy")
        sync = WeightSync(settings, state, redis_client)
        pub.publish(versions[0], step=versions[0])
        await sync.start()
        if before is not None:
            before(sync)
        tasks = sync.tasks()
        try:
            for version in versions:
                if version != versions[0]:
                    pub.publish(version, step=version)
                name = pub.model_name(version)
                await _until(lambda n=name, v=version: n in _served(server) and state.version == v)
                await _until(lambda v=version: sync.fleet.servers[normalize(server)].eligible(v))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await sync.aclose()
        return sync, state

    pub_a = _publisher(monkeypatch, redis_client, weights_root / "run-a", adapter_a)
    asyncio.run(run(pub_a, range(1, 3)))
    run_a = pub_a.run_id
    names_a = {pub_a.model_name(v) for v in (1, 2)}
    assert names_a <= _served(server)
    assert redis_client.get("policy:version:run").decode() == run_a

    redis_client.flushall()  # a wiped Redis: a new run, whose counter starts again at 1
    pub_b = _publisher(monkeypatch, redis_client, weights_root / "run-b", adapter_b)
    assert pub_b.run_id != run_a and redis_client.get("policy:version:run").decode() == pub_b.run_id
    assert parse_adapter_name(pub_b.model_name(1)) == ("policy", pub_b.run_id, 1)

    def not_yet_served(sync: WeightSync) -> None:
        # A's v1 (and v2) on the server: B's watch does not take them for B's v1, so it loads B's.
        assert sync.fleet.servers[normalize(server)].version == 0

    asyncio.run(run(pub_b, range(1, 4), before=not_yet_served))
    served = _served(server)
    assert served == {"policy", pub_b.model_name(2), pub_b.model_name(3)}  # keep_adapters = 2; A's all unloaded
    assert not served & names_a

    # B's v3 is B's weights (the zero adapter: the base's logprobs), not A's perturbation.
    with SyncInferenceClient(server) as client:
        base = client.complete("policy", PROMPT, max_tokens=8, seed=3, ignore_eos=True).choices[0]
        b3 = client.complete(pub_b.model_name(3), PROMPT, max_tokens=8, seed=3, ignore_eos=True).choices[0]
        assert b3.token_ids == base.token_ids and max_diff(b3.logprobs, base.logprobs) < 1e-5
        for name in names_a:
            with pytest.raises(InferenceError) as refused:
                client.complete(name, PROMPT, max_tokens=1)
            assert refused.value.status_code == 404
