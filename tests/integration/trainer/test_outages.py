"""The trainer against its dependencies failing, with real processes throughout: Redis stopped and restarted,
then frozen past redis-py's 5 s socket timeout, mid-training; the inference server killed and restarted
around a publish (which needs no server: the rollout's weight sync loads the version once it is back); SIGTERM while Redis is gone, then a start before Redis is back; and schema-valid groups
the model cannot train on (a token id outside the vocabulary, a NaN logprob), which must be dead-lettered
instead of crash-looping the trainer."""

from __future__ import annotations

import collections
import json
import math
import os
import random
import signal
import time

import pytest

from shared.inference_sync import SyncInferenceClient
from shared.protocol import TrajectoryGroup
from shared.redis_server import RedisServer, free_port
from shared.stream import StreamQueue
from tests.integration.trainer import harness as h


@pytest.fixture
def own_redis(tmp_path):
    """A Redis of this test alone (its outages must not hit other tests); AOF, so a restart keeps the streams."""
    server = RedisServer(persist_dir=tmp_path / "redis").start()
    yield server
    server.stop()


def _args(tmp, model, url: str, *extra: str) -> list[str]:
    return h.trainer_args(tmp, model, url, *extra)


def _publish(client, rng: random.Random, first: int, n: int) -> list[str]:
    queue = StreamQueue(client, "trajectories", TrajectoryGroup)
    return [queue.publish(h.random_group(rng, i)) for i in range(first, first + n)]


def _steps(tmp) -> int:
    """Steps the trainer has finished (one JSONL record each, written last in a step)."""
    path = tmp / "logs" / "train.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def _wait_steps(tmp, n: int, proc, log, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while _steps(tmp) < n:
        assert proc.poll() is None, f"trainer exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no step {n} within {timeout_s}s:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


def _trained_once(tmp, n_groups: int) -> dict:
    state = h.checkpoint_state(tmp / "ckpt")
    counts = collections.Counter(state["recent_groups"])
    assert sorted(counts) == [f"g{i:04d}" for i in range(n_groups)] and set(counts.values()) == {1}
    assert state["groups_trained"] == n_groups
    return state


@pytest.mark.slow
def test_redis_restart_and_freeze_are_waited_out(tmp_path, own_redis):
    rng = random.Random(1)
    model = h.save_tiny_model(tmp_path / "model")
    client = own_redis.client()
    _publish(client, rng, 0, 2)
    log = tmp_path / "trainer.log"
    proc = h.start_trainer(_args(tmp_path, model, own_redis.url, "--groups-per-step", "2", "--max-steps", "3"), log)
    _wait_steps(tmp_path, 1, proc, log)
    # Gone for 3 s while the trainer waits for groups (SIGTERM: Redis flushes its AOF, so the restart loses
    # nothing; the trainer sees the same dropped connection and refused reconnects as after a crash).
    own_redis.stop()
    time.sleep(3)
    own_redis.start()
    _publish(client, rng, 2, 2)
    _wait_steps(tmp_path, 2, proc, log)
    # Frozen for 7 s: every call the trainer makes meanwhile times out (redis-py's 5 s socket timeout).
    os.kill(own_redis.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(7)
    finally:
        os.kill(own_redis.proc.pid, signal.SIGCONT)
    _publish(client, rng, 4, 2)
    assert proc.wait(120) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "redis unreachable" in text and "redis is back" in text
    state = _trained_once(tmp_path, 6)
    assert state["step"] == 3
    stats = StreamQueue(client, "trajectories", TrajectoryGroup, group="trainer", consumer="x").stats()
    assert stats.pending == 0 and stats.lag == 0


@pytest.mark.slow
def test_a_publish_needs_no_inference_server(tmp_path, redis_client, redis_server):
    """The trainer publishes with the server gone (it writes and announces; it loads nothing), and the rollout's
    weight sync loads the live version into the server once it is back."""
    rng = random.Random(2)
    model = h.save_tiny_model(tmp_path / "model")
    port = free_port()
    server, url = h.start_server(model, tmp_path, port=port)
    sync = h.start_weight_sync(redis_server.url, url, tmp_path / "sync.log")
    log = tmp_path / "trainer.log"
    proc = None
    try:
        with SyncInferenceClient(url) as llm:
            llm.wait_ready(120)
            _publish(redis_client, rng, 0, 2)
            args = ("--groups-per-step", "2", "--max-steps", "2", "--inference-url", url)
            proc = h.start_trainer(_args(tmp_path, model, redis_server.url, *args), log)
            _wait_steps(tmp_path, 1, proc, log, timeout_s=180)
            _wait_served(llm, 1, timeout_s=60)
            server.kill()
            server.wait(30)
            _publish(redis_client, rng, 2, 2)  # step 2 trains and publishes with no server
            assert proc.wait(180) == 0, log.read_text()[-3000:]
            assert int(redis_client.get("policy:version")) == 2
            server, _ = h.start_server(model, tmp_path, port=port)
            llm.wait_ready(120)
            _wait_served(llm, 2, timeout_s=60)  # the weight sync brought it up to the live version
    finally:
        for p in (proc, sync, server):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(30)
    assert "inference server" not in log.read_text()  # the trainer never talked to it


def _wait_served(llm: SyncInferenceClient, version: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (llm.served_version() or 0) < version:
        assert time.monotonic() < deadline, f"the server never served version {version}"
        time.sleep(0.1)


@pytest.mark.slow
def test_sigterm_with_redis_gone_checkpoints_exits_0_and_the_next_start_acks(tmp_path, own_redis):
    rng = random.Random(3)
    model = h.save_tiny_model(tmp_path / "model")
    client = own_redis.client()
    ids = _publish(client, rng, 0, 3)
    log = tmp_path / "trainer.log"
    # One group per step, a checkpoint every 2 steps: after step 3, group 3 is trained and not checkpointed.
    args = _args(tmp_path, model, own_redis.url, "--groups-per-step", "1", "--checkpoint-every", "2")
    proc = h.start_trainer(args, log)
    _wait_steps(tmp_path, 3, proc, log)
    own_redis.stop()
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(90) == 0, log.read_text()[-3000:]
    state = h.checkpoint_state(tmp_path / "ckpt")
    assert state["step"] == 3 and state["covered"] == [ids[2]]
    assert "not acknowledged" in log.read_text()

    # The next start, while Redis is still down: it waits for Redis, then acks group 3 instead of retraining it.
    second = tmp_path / "second.log"
    proc = h.start_trainer([*args, "--max-steps", "4"], second)
    deadline = time.monotonic() + 60
    while "redis unreachable" not in second.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, second.read_text()[-3000:]
        time.sleep(0.1)
    time.sleep(2)
    own_redis.start()
    _publish(client, rng, 3, 1)
    assert proc.wait(120) == 0, second.read_text()[-3000:]
    text = second.read_text()
    assert "redis is back" in text
    assert 'msg="acknowledging groups the checkpoint already contains" count=1' in text
    state = _trained_once(tmp_path, 4)
    assert state["step"] == 4
    stats = StreamQueue(client, "trajectories", TrajectoryGroup, group="trainer", consumer="x").stats()
    assert stats.pending == 0 and stats.lag == 0


@pytest.mark.slow
def test_untrainable_groups_are_dead_lettered_and_training_goes_on(tmp_path, redis_client, redis_server):
    rng = random.Random(4)
    model = h.save_tiny_model(tmp_path / "model")
    queue = StreamQueue(redis_client, "trajectories", TrajectoryGroup)
    good = [h.random_group(rng, i) for i in range(4)]
    oov = h.random_group(rng, 100)
    oov.samples[0].token_ids[-1] = h.VOCAB  # one past the embedding table
    nan = h.random_group(rng, 101)
    nan.samples[-1].logprobs[-1] = math.nan
    ids = [queue.publish(g) for g in (good[0], oov, good[1], nan, good[2], good[3])]
    log = tmp_path / "trainer.log"
    args = _args(tmp_path, model, redis_server.url, "--groups-per-step", "2", "--max-steps", "2")
    assert h.start_trainer(args, log).wait(120) == 0, log.read_text()[-3000:]
    _trained_once(tmp_path, 4)
    dead = {d["source_id"]: d["reason"] for d in queue.dead_letters()}
    assert set(dead) == {ids[1], ids[3]}
    assert "vocabulary" in dead[ids[1]] and "logprob" in dead[ids[3]]
    assert json.loads((tmp_path / "logs" / "train.jsonl").read_text().splitlines()[-1])["step"] == 2


@pytest.mark.slow
def test_an_outage_past_the_give_up_time_ends_the_trainer(tmp_path):
    model = h.save_tiny_model(tmp_path / "model")
    log = tmp_path / "trainer.log"
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    start = time.monotonic()
    args = _args(tmp_path, model, nowhere, "--groups-per-step", "1", "--dependency-timeout-s", "2")
    assert h.start_trainer(args, log).wait(120) == 1
    text = log.read_text()
    assert "redis unreachable: waiting for it" in text and "DependencyDown: redis unreachable for 2" in text
    assert time.monotonic() - start < 60
