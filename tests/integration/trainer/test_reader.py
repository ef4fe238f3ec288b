"""GroupReader on a real Redis: covered entries are acked not re-delivered; a replaced consumer's pending
entries are taken over."""

from __future__ import annotations

from services.trainer.batches import GroupReader
from shared.protocol import TrajectoryGroup
from shared.stream import StreamQueue
from tests.factories import make_group


def _queue(client, consumer: str) -> StreamQueue:
    return StreamQueue(client, "trajectories", TrajectoryGroup, group="trainer", consumer=consumer)


def test_covered_entries_acked_and_orphans_claimed(redis_client):
    producer = StreamQueue(redis_client, "trajectories", TrajectoryGroup)
    ids = [producer.publish(make_group(prompt_id=f"q{i}")) for i in range(5)]
    old = _queue(redis_client, "trainer-old")
    old.ensure_group()
    assert [e.id for e in old.read(count=3)] == ids[:3]  # delivered to a consumer that then died
    # The new trainer's checkpoint already contains the first entry's effect.
    reader = GroupReader(_queue(redis_client, "trainer-0"), covered=[ids[0]], block_ms=10)
    got = reader.collect(3)
    assert [e.id for e in got] == ids[1:4]
    assert _queue(redis_client, "x").pending_ids() == ids[1:4]  # ids[0] acked, the rest pending until a checkpoint
    assert [e.id for e in reader.collect(1)] == [ids[4]]  # pending entries are not served twice
    producer.publish(make_group(prompt_id="late"))
    assert [e.message.prompt_id for e in reader.collect(1)] == ["late"]
