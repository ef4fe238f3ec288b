"""The trainer across hosts: two torchrun "nodes" (``--nnodes 2``, one rank each, gloo) on 127.0.0.1 against
one Redis, ZeRO-2 (each rank writes its own optimizer shard). Node 1's rank is SIGKILLed after a checkpoint:
node 0 must end non-zero at once; the same two commands resume from that checkpoint; node 1's rank is then
frozen (SIGSTOP, its sockets still open): node 0 must end within ``collective_timeout_s``; the same commands
then finish the run, every group trained exactly once and the step count continuous."""

from __future__ import annotations

import collections
import contextlib
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from services.trainer import checkpoint
from shared.protocol import TrajectoryGroup
from shared.redis_server import free_port
from shared.stream import StreamQueue
from tests.integration.trainer import harness as h

PER_STEP, STEPS = 2, 6
TIMEOUT_S = 30  # collective_timeout_s
MARGIN_S = 40  # the survivor's exit and torchrun's shutdown, on a loaded 2-core machine
START_S = 900  # two nodes starting (imports, DeepSpeed, rendezvous) on a loaded 2-core machine


def _args(tmp: Path, model: Path, url: str) -> list[str]:
    return h.trainer_args(
        tmp,
        model,
        url,
        "--zero-stage",
        "2",
        "--groups-per-step",
        str(PER_STEP),
        "--max-steps",
        str(STEPS),
        "--collective-timeout-s",
        str(TIMEOUT_S),
    )


def _nodes(
    args: list[str], tmp: Path, master_addr: str = "127.0.0.1", prefixes: tuple[list[str], ...] = ([], [])
) -> list[subprocess.Popen]:
    """The two hosts' commands, as an operator would type them (only ``--node_rank`` differs); ``prefixes``:
    what runs each node's command on its host (``ip netns exec NS`` for a simulated one)."""
    port = free_port()
    procs = []
    for node in (0, 1):
        with open(tmp / f"node{node}.log", "ab") as fh:
            cmd = [*prefixes[node], sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
            cmd += ["--node_rank", str(node), "--nproc_per_node", "1"]
            cmd += ["--master_addr", master_addr, "--master_port", str(port)]
            procs.append(
                subprocess.Popen(
                    [*cmd, "-m", "services.trainer", "train", *args],
                    cwd=h.REPO,
                    env=h.trainer_env(),
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    return procs


def _worker(node: subprocess.Popen) -> psutil.Process:
    """The trainer process torchrun started on ``node`` (its one rank)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        children = psutil.Process(node.pid).children()
        if children:
            return children[0]
        time.sleep(0.2)
    raise AssertionError("torchrun started no worker")


def _wait_checkpoint(root: Path, step: int, nodes: list[subprocess.Popen], tmp: Path) -> None:
    deadline = time.monotonic() + START_S
    while not ((last := checkpoint.latest(root)) and int(last.name.split("-")[1]) >= step):
        assert all(n.poll() is None for n in nodes), _logs(tmp)
        assert time.monotonic() < deadline, _logs(tmp)
        time.sleep(0.2)


def _ended(node: subprocess.Popen, since: float, tmp: Path) -> float:
    """Seconds from ``since`` until ``node`` (torchrun) exited non-zero."""
    rc = node.wait(TIMEOUT_S + MARGIN_S)
    assert rc != 0, _logs(tmp)
    return time.monotonic() - since


def _kill(nodes: list[subprocess.Popen]) -> None:
    for node in nodes:
        try:
            tree = [*psutil.Process(node.pid).children(recursive=True), psutil.Process(node.pid)]
        except psutil.NoSuchProcess:
            continue
        for proc in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        node.wait(30)


def _logs(tmp: Path) -> str:
    return "\n".join(f"--- node{n}\n" + (tmp / f"node{n}.log").read_text()[-3000:] for n in (0, 1))


def _publish(queue: StreamQueue, rng: random.Random, first: int, steps: int) -> list[str]:
    return [queue.publish(h.random_group(rng, i)) and f"g{i:04d}" for i in range(first, first + steps * PER_STEP)]


@pytest.mark.slow
@pytest.mark.timeout(3600)  # three two-node starts; on a busy 2-core machine each can take minutes
def test_two_nodes_lose_a_rank_stop_in_bounded_time_and_resume(tmp_path, redis_client, redis_server):
    rng = random.Random(3)
    model = h.save_tiny_model(tmp_path / "model")
    queue = StreamQueue(redis_client, "trajectories", TrajectoryGroup)
    args = _args(tmp_path, model, redis_server.url)
    published = _publish(queue, rng, 0, 2)  # two steps now, more per run: each run stops where it is told
    nodes: list[subprocess.Popen] = []
    try:
        # 1. A rank killed: its sockets close, the survivor's next collective fails at once.
        nodes = _nodes(args, tmp_path)
        _wait_checkpoint(tmp_path / "ckpt", 2, nodes, tmp_path)
        killed = time.monotonic()
        _worker(nodes[1]).send_signal(signal.SIGKILL)
        took = _ended(nodes[0], killed, tmp_path)
        assert nodes[1].wait(30) != 0
        assert "another rank died" in (tmp_path / "node0.log").read_text(), _logs(tmp_path)
        print(f"killed rank: node 0 ended after {took:.1f}s")

        # 2. The same commands resume there; a frozen rank keeps its sockets: only the timeout ends the job.
        published += _publish(queue, rng, len(published), 2)
        nodes = _nodes(args, tmp_path)
        _wait_checkpoint(tmp_path / "ckpt", 4, nodes, tmp_path)
        frozen = _worker(nodes[1])
        frozen.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        took = _ended(nodes[0], stopped, tmp_path)
        assert TIMEOUT_S - 1 <= took <= TIMEOUT_S + MARGIN_S, took
        print(f"frozen rank: node 0 ended after {took:.1f}s (collective_timeout_s {TIMEOUT_S})")
        _kill(nodes)  # node 1's torchrun waits for its frozen rank forever, like a hung host would

        # 3. The same commands again: the run finishes.
        published += _publish(queue, rng, len(published), STEPS - 4)
        nodes = _nodes(args, tmp_path)
        assert [n.wait(START_S) for n in nodes] == [0, 0], _logs(tmp_path)
    finally:
        _kill(nodes)

    resumed = re.findall(r"msg=resumed .*? step=(\d+)", (tmp_path / "node0.log").read_text())
    assert [int(n) for n in resumed] == [2, 4], resumed  # each start continued from the last checkpoint
    state = h.checkpoint_state(tmp_path / "ckpt")
    assert state["step"] == STEPS and state["world"] == 2
    counts = collections.Counter(state["recent_groups"])
    assert sorted(counts) == sorted(published) and set(counts.values()) == {1}, counts
    folder = checkpoint.latest(tmp_path / "ckpt") / checkpoint.DS_TAG
    shards = sorted(p.name for p in folder.glob("*optim_states.pt"))
    assert len(shards) == 2, shards  # ZeRO-2: one optimizer shard per rank
    model_states = torch.load(next(folder.glob("*model_states.pt")), weights_only=False)
    assert model_states["global_steps"] == STEPS  # the engine's step count carried over both failures
    stats = StreamQueue(redis_client, "trajectories", TrajectoryGroup, group="trainer", consumer="x").stats()
    assert stats.pending == 0 and stats.lag == 0
