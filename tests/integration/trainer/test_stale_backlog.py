"""A trainer restarted onto a backlog of stale groups: it drains it without counting steps or publishing
versions for steps that trained nothing, says so, keeps the rollout's admission going, and then trains."""

from __future__ import annotations

import random

import pytest

from shared.protocol import TrajectoryGroup, WeightUpdate
from shared.stream import AdmissionMarks, StreamQueue, decode
from tests.integration.trainer import harness as h

PER_STEP = 2


@pytest.mark.slow
def test_stale_backlog_drains_then_real_tokens_train(tmp_path, redis_client, redis_server):
    rng = random.Random(3)
    model = h.save_tiny_model(tmp_path / "model")
    queue = StreamQueue(redis_client, "trajectories", TrajectoryGroup)
    # A run whose checkpoint was lost: Redis says version 5 is live, and 6 was reserved by a publish that
    # crashed between the server's load and the announcement. The backlog was sampled by version 0.
    redis_client.set("policy:version", 5)
    redis_client.set("policy:version:reserved", 6)
    stale = [h.random_group(rng, i, version=0) for i in range(3 * PER_STEP)]
    fresh = [h.random_group(rng, 100 + i, version=7) for i in range(PER_STEP)]
    for g in stale + fresh:
        queue.publish(g)
        redis_client.incr("rollout:published")
    args = [
        "--model",
        str(model),
        "--redis-url",
        redis_server.url,
        "--groups-per-step",
        str(PER_STEP),
        "--max-steps",
        "1",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--weights-dir",
        str(tmp_path / "w"),
        "--log-dir",
        str(tmp_path / "logs"),
        "--port",
        "0",
        "--micro-batch-tokens",
        "48",
        "--read-block-ms",
        "100",
        "--max-staleness",
        "1",
        "--stale-policy",
        "drop",
    ]
    log = tmp_path / "trainer.log"
    assert h.start_trainer(args, log).wait(180) == 0, log.read_text()[-3000:]

    state = h.checkpoint_state(tmp_path / "ckpt")
    # The three all-stale batches were not steps: the one step is the fresh batch, with real tokens.
    assert state["step"] == 1 and state["tokens"] > 0
    assert state["dropped_stale"] == sum(len(g.samples) for g in stale)
    assert state["recent_groups"] == [g.group_id for g in stale + fresh]
    assert state["groups_trained"] == len(stale + fresh)
    # Versions: 7 at start (5 and 6 went to other weights), 8 after the one real step; none for empty steps.
    events = [decode(WeightUpdate, f).version for _, f in redis_client.xrange("weights")]
    assert events == [7, 8]
    assert int(redis_client.get("policy:version")) == state["version"] == 8
    # The rollout was told that all 8 published groups were taken, at the version it now serves.
    mark = AdmissionMarks(redis_client).read()
    assert (mark.version, mark.consumed) == (8, 8)
    # Everything taken was acked (the empty steps' groups with the next checkpoint).
    stats = StreamQueue(redis_client, "trajectories", TrajectoryGroup, group="trainer", consumer="x").stats()
    assert stats.pending == 0 and stats.lag == 0
    text = log.read_text()
    assert text.count("no RL sample trained in this step: all were stale") == 3


@pytest.mark.slow
def test_the_start_up_mark_leaves_out_the_backlog_a_restart_retrains(tmp_path, redis_client, redis_server):
    """Groups delivered to a trainer that died before checkpointing them are trained again after the restart.
    Until then they are not taken: a start-up mark counting them would let the rollout start groups at the
    resumed version that the retraining steps leave a version further behind (dropped as stale)."""
    rng = random.Random(4)
    model = h.save_tiny_model(tmp_path / "model")
    queue = StreamQueue(redis_client, "trajectories", TrajectoryGroup)
    for i in range(2 * PER_STEP):
        queue.publish(h.random_group(rng, i))
        redis_client.incr("rollout:published")
    args = [
        "--model",
        str(model),
        "--redis-url",
        redis_server.url,
        "--groups-per-step",
        str(PER_STEP),
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--weights-dir",
        str(tmp_path / "w"),
        "--log-dir",
        str(tmp_path / "logs"),
        "--port",
        "0",
        "--micro-batch-tokens",
        "48",
        "--read-block-ms",
        "100",
        "--max-steps",
        "2",
    ]
    log = tmp_path / "trainer.log"
    # Killed in its first step: one step's groups delivered, nothing checkpointed.
    assert h.start_trainer(args, log, CODA_TRAINER_FAULT="mid_step:1").wait(180) == -9
    # Restarted, and killed again in the first retraining step: the mark is the one written at start-up.
    assert h.start_trainer(args, log, CODA_TRAINER_FAULT="mid_step:1").wait(180) == -9
    mark = AdmissionMarks(redis_client).read()
    assert (mark.version, mark.consumed) == (0, 0), log.read_text()[-3000:]
    # Run to the end: the backlog and the next step trained, every group taken.
    assert h.start_trainer(args, log).wait(180) == 0, log.read_text()[-3000:]
    mark = AdmissionMarks(redis_client).read()
    assert (mark.version, mark.consumed) == (2, 2 * PER_STEP)
