"""The admission mark against a real Redis: what the trainer counts as consumed, and when the rollout uses it."""

from __future__ import annotations

import asyncio
import random

from agents.core.llm import PolicyState
from services.rollout.weights import WeightFollower
from shared.protocol import TrajectoryGroup
from shared.stream import AdmissionMarks, StreamQueue, served_count
from tests.integration.trainer.harness import random_group


def _publish(queue, counter_client, n: int, start: int, admitted: bool = True) -> None:
    rng = random.Random(start)
    for i in range(start, start + n):
        queue.publish(random_group(rng, i))
        if admitted:  # what the rollout's producer does after XADD; a foreign writer does not
            counter_client.incr("rollout:published")


def test_consumed_counts_what_the_trainer_was_served(redis_client):
    producer = StreamQueue(redis_client, "trajectories", TrajectoryGroup)
    trainer = StreamQueue(redis_client, "trajectories", TrajectoryGroup, group="trainer", consumer="t")
    assert served_count(redis_client, "trajectories", "trainer", "rollout:published") == 0  # nothing yet
    _publish(producer, redis_client, 5, 0)
    assert served_count(redis_client, "trajectories", "trainer", "rollout:published") == 0  # no group yet
    trainer.ensure_group()
    assert len(trainer.read(count=3)) == 3
    # Served but not acked (pending) counts as taken: it is in the trainer's hands.
    assert served_count(redis_client, "trajectories", "trainer", "rollout:published") == 3
    _publish(producer, redis_client, 2, 10, admitted=False)  # foreign groups, not in the counter
    assert served_count(redis_client, "trajectories", "trainer", "rollout:published") == 1
    assert len(trainer.read(count=10)) == 4  # the trainer takes everything
    assert served_count(redis_client, "trajectories", "trainer", "rollout:published") == 5


async def test_follower_passes_the_mark_on_only_at_its_version(redis_client):
    state = PolicyState(model_name="policy", served_model_name="policy")
    seen: list[int] = []

    async def on_consumed(n: int) -> None:
        seen.append(n)

    redis_client.set("policy:version", 2)
    marks = AdmissionMarks(redis_client)  # the trainer's side
    marks.write(version=3, consumed=12)
    follower = WeightFollower(redis_client, state, on_consumed=on_consumed)
    await follower.start()
    assert state.version == 2 and seen == []  # the mark belongs to weights this process does not use yet
    redis_client.set("policy:version", 3)
    await WeightFollower(redis_client, state, on_consumed=on_consumed).start()
    assert seen == [12]
    marks.write(version=3, consumed=14)
    task = asyncio.create_task(follower.run(block_ms=50))
    try:
        await asyncio.sleep(0.3)
        assert seen[-1] == 14  # an empty step's mark: same version, more groups taken
    finally:
        task.cancel()
    assert marks.read().consumed == 14
