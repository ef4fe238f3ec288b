"""The weight follower against a real Redis: catch-up at start, LoRA vs full events, stale events."""

from __future__ import annotations

import asyncio
import time

from agents.core.llm import PolicyState
from services.rollout.weights import WeightFollower
from shared.protocol import WeightUpdate
from shared.stream import StreamQueue


def event(version: int, kind: str) -> WeightUpdate:
    return WeightUpdate(
        version=version,
        kind=kind,
        model_name=f"policy-v{version}",
        path=f"/w/{version}",
        step=version,
        created_at=time.time(),
    )


async def test_follower_applies_lora_and_full_events(redis_client):
    weights = StreamQueue(redis_client, "weights", WeightUpdate)
    weights.publish(event(1, "lora"))
    state = PolicyState(model_name="policy", served_model_name="policy")
    seen: list[int] = []

    async def on_version(v: int) -> None:
        seen.append(v)

    follower = WeightFollower(redis_client, state, on_version=on_version)
    await follower.start()
    assert (state.version, state.model_name) == (1, "policy-v1")  # caught up from the last event
    task = asyncio.create_task(follower.run(block_ms=50))
    try:
        weights.publish(event(2, "full"))
        await asyncio.sleep(0.3)
        assert (state.version, state.model_name) == (2, "policy")  # full reload: base name, new version
        weights.publish(event(1, "lora"))  # stale: ignored
        redis_client.xadd("weights", {b"data": b"not msgpack"})  # malformed: skipped, loop alive
        weights.publish(event(3, "lora"))
        await asyncio.sleep(0.3)
        assert (state.version, state.model_name) == (3, "policy-v3") and seen == [1, 2, 3]
    finally:
        task.cancel()


async def test_version_key_ahead_of_stream(redis_client):
    redis_client.set("policy:version", 5)
    state = PolicyState(model_name="policy", served_model_name="policy")
    await WeightFollower(redis_client, state).start()
    assert (state.version, state.model_name) == (5, "policy")
