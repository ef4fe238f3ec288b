"""The Redis Streams queue against a real redis-server: delivery, crash recovery, claiming, dead letters, MAXLEN."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from shared.protocol import TrajectoryGroup, WeightUpdate
from shared.stream import StreamQueue, encode
from tests.factories import make_group, make_weight_update

STREAM = "trajectories"


def consumer(client, name: str, **kw) -> StreamQueue[TrajectoryGroup]:
    q = StreamQueue(client, STREAM, TrajectoryGroup, group="trainer", consumer=name, **kw)
    q.ensure_group()
    return q


def test_publish_consume_ack(redis_client):
    producer = StreamQueue(redis_client, STREAM, TrajectoryGroup)
    sent = [make_group(prompt_id=f"q{i}") for i in range(3)]
    ids = [producer.publish(g) for g in sent]
    q = consumer(redis_client, "c1")
    got = q.read(count=10)
    assert [e.id for e in got] == ids
    assert [e.message for e in got] == sent
    assert q.stats().pending == 3
    assert q.ack(*ids) == 3
    stats = q.stats()
    assert (stats.depth, stats.pending, stats.lag) == (3, 0, 0)
    assert q.read(count=10) == []


def test_lag_counts_undelivered_entries(redis_client):
    producer = StreamQueue(redis_client, STREAM, TrajectoryGroup)
    q = consumer(redis_client, "c1")
    for i in range(5):
        producer.publish(make_group(prompt_id=f"q{i}"))
    q.read(count=2)
    stats = q.stats()
    assert (stats.depth, stats.pending, stats.lag) == (5, 2, 3)


def test_read_blocks_until_a_message_arrives(redis_client):
    q = consumer(redis_client, "c1")
    start = time.monotonic()
    assert q.read(count=1, block_ms=200) == []
    assert time.monotonic() - start >= 0.15


CRASHING_CONSUMER = textwrap.dedent("""
    import os, sys, redis
    from shared.protocol import TrajectoryGroup
    from shared.stream import StreamQueue, encode
    q = StreamQueue(redis.Redis.from_url(sys.argv[1]), "trajectories", TrajectoryGroup,
                    group="trainer", consumer="worker-1")
    q.ensure_group()
    got = q.read(count=10)
    print(len(got), flush=True)
    os.kill(os.getpid(), 9)  # die before acknowledging, as a SIGKILLed trainer would
""")


def test_consumer_killed_before_ack_gets_its_entries_again(redis_server, redis_client):
    producer = StreamQueue(redis_client, STREAM, TrajectoryGroup)
    sent = [producer.publish(make_group(prompt_id=f"q{i}")) for i in range(2)]
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.run(
        [sys.executable, "-c", CRASHING_CONSUMER, redis_server.url],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.strip() == "2"
    q = consumer(redis_client, "worker-1")
    assert q.pending_ids("worker-1") == sent
    again = q.read(count=10)  # the restarted consumer (same name) starts with its pending entries
    assert [e.id for e in again] == sent
    q.ack(*sent)
    producer.publish(make_group(prompt_id="new"))
    fresh = q.read(count=10)  # after recovery, new entries flow
    assert [e.message.prompt_id for e in fresh] == ["new"]


def test_dead_consumers_entries_are_claimed_by_another(redis_client):
    producer = StreamQueue(redis_client, STREAM, TrajectoryGroup)
    ids = [producer.publish(make_group(prompt_id=f"q{i}")) for i in range(3)]
    dead = consumer(redis_client, "dead")
    assert len(dead.read(count=3)) == 3  # delivered, never acknowledged
    alive = consumer(redis_client, "alive")
    assert alive.claim(min_idle_ms=60_000) == []  # not idle long enough yet
    time.sleep(0.12)
    claimed = alive.claim(min_idle_ms=100)
    assert [e.id for e in claimed] == ids
    assert alive.pending_ids("alive") == ids
    assert alive.pending_ids("dead") == []
    alive.ack(*ids)
    assert alive.stats().pending == 0


def test_malformed_message_goes_to_dead_letters(redis_client):
    producer = StreamQueue(redis_client, STREAM, TrajectoryGroup)
    good_before = producer.publish(make_group(prompt_id="before"))
    redis_client.xadd(STREAM, {b"data": b"\xc1not msgpack"})
    redis_client.xadd(STREAM, {b"other": b"field"})
    wrong_type = redis_client.xadd(STREAM, encode(make_weight_update()))  # valid msgpack, wrong model
    good_after = producer.publish(make_group(prompt_id="after"))
    q = consumer(redis_client, "c1")
    got = q.read(count=10)
    assert [e.id for e in got] == [good_before, good_after]
    dead = q.dead_letters()
    reasons = " | ".join(d["reason"] for d in dead)
    assert len(dead) == 3
    assert "not msgpack" in reasons and "no 'data' field" in reasons and "does not validate" in reasons
    assert wrong_type.decode() in {d["source_id"] for d in dead}
    stats = q.stats()
    assert stats.pending == 2 and stats.dead_letters == 3  # bad entries were acknowledged, not left pending


def test_maxlen_holds(redis_client):
    exact = StreamQueue(redis_client, "exact", WeightUpdate, maxlen=50, approximate=False)
    for v in range(300):
        exact.publish(make_weight_update(v))
    assert redis_client.xlen("exact") == 50
    newest = exact.r.xrevrange("exact", count=1)[0]
    assert newest  # the newest entries are the ones kept
    approx = StreamQueue(redis_client, "approx", WeightUpdate, maxlen=50, approximate=True)
    for v in range(1000):
        approx.publish(make_weight_update(v))
    # Approximate trimming removes whole radix-tree nodes (100 entries by default), never more than asked.
    assert 50 <= redis_client.xlen("approx") <= 150


def test_pending_entry_trimmed_away_is_acknowledged_not_redelivered(redis_client):
    producer = StreamQueue(redis_client, STREAM, TrajectoryGroup)
    first = producer.publish(make_group(prompt_id="old"))
    q = consumer(redis_client, "c1")
    assert [e.id for e in q.read(count=1)] == [first]
    redis_client.xtrim(STREAM, maxlen=0)  # data gone while still pending
    restarted = consumer(redis_client, "c1")
    assert restarted.read(count=10) == []
    assert restarted.stats().pending == 0


def test_publish_rejects_wrong_type(redis_client):
    q = StreamQueue(redis_client, STREAM, TrajectoryGroup)
    try:
        q.publish(make_weight_update())
    except TypeError as exc:
        assert "expected TrajectoryGroup" in str(exc)
    else:
        raise AssertionError("publishing the wrong type must fail")


def test_redis_launcher_stops_on_one_sigterm(tmp_path):
    from shared.redis_server import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shared.redis_server", "--port", str(port), "--dir", str(tmp_path)],
        env=dict(os.environ, PYTHONPATH=os.getcwd()),
    )
    import redis

    client = redis.Redis(port=port)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if client.ping():
                break
        except redis.ConnectionError:
            time.sleep(0.1)
    client.set("k", "v")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    assert (tmp_path / "appendonlydir").exists() or list(tmp_path.glob("*.aof"))  # AOF persistence was on


def test_pending_entries_are_served_once_per_start(redis_client):
    """A consumer that acks late (after a checkpoint) never gets its unacked entries twice in one run."""
    producer = StreamQueue(redis_client, STREAM, TrajectoryGroup)
    ids = [producer.publish(make_group(prompt_id=f"q{i}")) for i in range(5)]
    first = consumer(redis_client, "c1")
    assert [e.id for e in first.read(count=2)] == ids[:2]  # delivered, not acked (crash follows)
    restarted = consumer(redis_client, "c1")
    assert [e.id for e in restarted.read(count=1)] == ids[:1]  # backlog, one at a time
    assert [e.id for e in restarted.read(count=5)] == ids[1:2]  # rest of the backlog, once
    assert [e.id for e in restarted.read(count=5)] == ids[2:]  # then new entries
    assert restarted.read(count=5) == []  # read but unacked entries are not served again
    assert restarted.pending_ids("c1") == ids
