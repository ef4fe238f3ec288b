"""The stream queue and the waiting redis client against a real Redis that stops, freezes and comes back; and
a consumer's own ``check`` dead-lettering messages that validate but that it cannot process."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import redis

from shared.protocol import TrajectoryGroup
from shared.redis_server import RedisServer
from shared.retry import Patience, Patient
from shared.stream import StreamQueue
from tests.factories import make_group

STREAM = "trajectories"


def test_entries_delivered_to_a_read_whose_reply_was_lost_are_served_next():
    with RedisServer() as server:  # its own: frozen below
        producer = StreamQueue(server.client(), STREAM, TrajectoryGroup)
        q = StreamQueue(server.client(socket_timeout=0.5), STREAM, TrajectoryGroup, group="trainer", consumer="c1")
        q.ensure_group()
        assert q.read(count=10) == []  # start-up recovery done: from now on reads take new entries
        ids = [producer.publish(make_group(prompt_id=f"q{i}")) for i in range(3)]
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(redis.TimeoutError):
                q.read(count=10)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        # Redis ran the queued XREADGROUP once it thawed: the entries are ours and pending, their reply lost.
        view = StreamQueue(server.client(), STREAM, TrajectoryGroup, group="trainer", consumer="x")
        deadline = time.monotonic() + 10
        while view.pending_ids("c1") != ids:
            assert time.monotonic() < deadline, view.pending_ids("c1")
            time.sleep(0.05)
        assert [e.id for e in q.read(count=10)] == ids
        assert q.read(count=10) == []  # served once
        later = producer.publish(make_group(prompt_id="later"))
        assert [e.id for e in q.read(count=10)] == [later]


def test_patient_transaction_is_sent_whole_once_redis_is_back(tmp_path):
    server = RedisServer(persist_dir=tmp_path / "redis").start()
    try:
        client = Patient(server.client(), Patience(give_up_s=30, backoff_s=0.05), "redis")
        client.set("kept", 1)
        server.stop()
        restart = threading.Timer(1.0, server.start)
        restart.start()
        pipe = client.pipeline(transaction=True)
        pipe.set("policy:version", 7)
        pipe.xadd("weights", {"version": "7"})
        result = pipe.execute()  # fails while Redis is down, then goes through with both commands
        restart.join()
        assert result[0] is True and len(result) == 2
        raw = server.client()
        assert raw.get("policy:version") == b"7" and raw.xlen("weights") == 1
        assert client.get("kept") == b"1"
    finally:
        server.stop()


def test_check_dead_letters_a_valid_message_the_consumer_cannot_process(redis_client):
    def check(group: TrajectoryGroup) -> None:
        if group.prompt_id == "bad":
            raise ValueError("token id 99 outside the model's vocabulary of 64")

    producer = StreamQueue(redis_client, STREAM, TrajectoryGroup)
    ids = [producer.publish(make_group(prompt_id=p)) for p in ("q0", "bad", "q1")]
    q = StreamQueue(redis_client, STREAM, TrajectoryGroup, group="trainer", consumer="c1", check=check)
    q.ensure_group()
    assert [e.message.prompt_id for e in q.read(count=10)] == ["q0", "q1"]
    [dead] = q.dead_letters()
    assert dead["source_id"] == ids[1] and "vocabulary" in dead["reason"]
    assert q.pending_ids() == [ids[0], ids[2]]  # the dead-lettered one is acked
