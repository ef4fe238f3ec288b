"""The stack across two simulated hosts: Linux network namespaces joined by a veth pair (``netns.py`` beside
this file), every process started on its host with ``ip netns exec`` and bound to that host's address.

- host A (10.77.0.1): Redis, policy server 1, trainer node 0 (the torchrun master), rollout 1;
- host B (10.77.0.2): policy server 2, trainer node 1, rollout 2.

The policy servers announce themselves in Redis, so each rollout samples from both (its own host's server is
its ``inference_url``). The rollouts own the fleet: the trainer only writes each version and announces it on
the ``weights`` stream (no ``--inference-url``: it never needs the fleet's addresses), and the rollouts alone
load it into every server behind (with the control token: a server on another host refuses loads without
it). The single-turn agent on the tiny model trains (``MIN_STEPS`` steps at least), while

1. policy server 2 is SIGKILLed: training goes on (server 1 takes every episode);
2. it is started again while training goes on: it serves the live weight version before it finishes any
   completion, then gets episodes again, and both rollouts see it at the live version;
3. trainer rank 1 (host B) is SIGKILLed: both nodes exit within a bounded time; the same two commands
   resume from the last checkpoint and training goes on, until both ranks are told to stop (SIGTERM, as
   Ctrl-C would) and both nodes exit 0. Each phase waits for the one before it, not for a step number
   (a step takes under a second here, a server start ten or more), so the pace of the machine decides
   nothing.

At the end every group the trainer was served is trained exactly once or still pending untrained (the fault
suite's ledger check, ``tests/faults/pipeline.py``, on the checkpoint's ledger against the stream), no group
was published twice or in part, and neither rollout dropped a prompt or blamed one for an outage.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis

from services.trainer import checkpoint
from shared.protocol import TrajectoryGroup
from shared.redis_server import find_redis_server
from shared.stream import decode
from tests.faults.pipeline import STREAM, Pipeline
from tests.integration.deploy import netns
from tests.integration.deploy.netns import Host
from tests.integration.rollout.servers import tiny_model
from tests.integration.trainer import harness as h
from tests.integration.trainer.test_multinode import _ended, _kill, _nodes, _worker

PER_STEP, N_SAMPLES = 2, 2
MIN_STEPS = 20  # steps trained in all, at least
MAX_STEPS = 500  # a bound only: the test stops the run itself
TIMEOUT_S = 30  # collective_timeout_s
REDIS_PORT, POLICY_PORT, ROLLOUT_PORT = 6379, 8002, 8004  # fresh namespaces: every port is free
TOKEN = "simulated-hosts-control-token"  # the control token: loads into a server on another host need it
START_S = 300  # processes starting (imports, DeepSpeed, rendezvous) on a loaded 2-core machine
STEPS_S = 180  # a few steps, or a restarted server catching up
STOP_S = 60  # both nodes ending after SIGTERM (they agree on the step, checkpoint, exit)


@pytest.fixture
def hosts():
    with netns.two_hosts(str(os.getpid())) as pair:
        yield pair


class _Ledger(Pipeline):
    """The fault suite's ledger (``Pipeline.ledger``, ``check_ledger_exact``) read from this test's Redis and
    checkpoints instead of a local stack's; call ``ledger`` on host A's network."""

    def __init__(self, redis_url: str, root: Path) -> None:  # no stack: only what the ledger reads
        self.redis_url, self.root = redis_url, root

    @property
    def checkpoints(self) -> Path:
        return self.root

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, socket_timeout=10)


@dataclass
class Stack:
    """The processes of both hosts, their logs under ``tmp``, and what the test reads from them."""

    tmp: Path
    a: Host
    b: Host
    model: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)  # those that must stay up
    nodes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def redis_url(self) -> str:
        return f"redis://{self.a.addr}:{REDIS_PORT}/0"

    @property
    def ckpt(self) -> Path:
        return self.tmp / "ckpt"

    # ---------------------------------------------------------------- starting
    def start_redis(self) -> None:
        cmd = [*self.a.wrap(), find_redis_server(), "--bind", self.a.addr, "--port", str(REDIS_PORT)]
        cmd += ["--dir", str(self.tmp), "--save", "", "--appendonly", "no", "--loglevel", "warning"]
        with open(self.tmp / "redis.log", "ab") as fh:
            self.procs["redis"] = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)

    def start_server(self, host: Host, name: str) -> str:
        """A policy server on ``host`` that announces itself in Redis (a heartbeat every second)."""
        url = host.url(POLICY_PORT)
        extra = ("--redis-url", self.redis_url, "--advertise-url", url, "--announce-every-s", "1")
        prefix = host.wrap(CODA_CONTROL_TOKEN=TOKEN)
        proc, _ = h.start_server(
            self.model, self.tmp, extra, POLICY_PORT, host=host.addr, prefix=prefix, log_name=f"{name}.log"
        )
        self.procs[name] = proc
        return url

    def start_rollout(self, host: Host, name: str, seed: int) -> None:
        env = {
            **h.trainer_env(),
            "CODA_CONTROL_TOKEN": TOKEN,
            "CODA_ROLLOUT_AGENT": "single-turn",
            "CODA_ROLLOUT_DATASET": "bundled:lookup",
            "CODA_ROLLOUT_ANSWER_METRIC": "f1",
            "CODA_ROLLOUT_TOKENIZER": str(self.model),
            "CODA_ROLLOUT_N_SAMPLES": str(N_SAMPLES),
            "CODA_ROLLOUT_GROUPS_PER_STEP": str(PER_STEP),
            "CODA_ROLLOUT_MAX_STALENESS": "1",
            "CODA_ROLLOUT_MAX_TOKENS_PER_TURN": "8",
            "CODA_ROLLOUT_MAX_CONTEXT_TOKENS": "512",
            "CODA_ROLLOUT_ADMISSION_SCOPE": "redis",  # two replicas, one admission budget
            "CODA_ROLLOUT_REDIS_URL": self.redis_url,
            "CODA_ROLLOUT_INFERENCE_URL": host.url(POLICY_PORT),  # the other host's server announces itself
            "CODA_ROLLOUT_FLEET_PROBE_S": "0.5",
            "CODA_ROLLOUT_RETRY_ATTEMPTS": "2",
            "CODA_ROLLOUT_RETRY_BACKOFF_S": "0.05",
            "CODA_ROLLOUT_HTTP_TIMEOUT_S": "30",
            "CODA_ROLLOUT_HOST": host.addr,
            "CODA_ROLLOUT_PORT": str(ROLLOUT_PORT),
            "CODA_ROLLOUT_SEED": str(seed),
        }
        with open(self.tmp / f"{name}.log", "ab") as fh:
            cmd = [*host.wrap(), sys.executable, "-m", "services.rollout", "serve"]
            self.procs[name] = subprocess.Popen(cmd, cwd=h.REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)

    def start_nodes(self) -> None:
        """Both trainer nodes, the master on host A; each host's gloo on its veth end."""
        args = h.trainer_args(
            self.tmp,
            self.model,
            self.redis_url,
            *("--zero-stage", "2", "--groups-per-step", str(PER_STEP), "--max-steps", str(MAX_STEPS)),
            *("--collective-timeout-s", str(TIMEOUT_S), "--max-staleness", "1", "--micro-batch-tokens", "4096"),
        )
        prefixes = tuple(host.wrap(GLOO_SOCKET_IFNAME=host.ifname) for host in (self.a, self.b))
        self.nodes = _nodes(args, self.tmp, self.a.addr, prefixes)

    # ---------------------------------------------------------------- reading
    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in sorted(self.tmp.glob("*.log"))
        )

    def check_alive(self) -> None:
        for name, proc in [*self.procs.items(), *((f"node{i}", n) for i, n in enumerate(self.nodes))]:
            assert proc.poll() is None, f"{name} exited with {proc.returncode}\n{self.logs()}"

    def wait(self, done: Callable[[], object], timeout_s: float, what: str) -> None:
        """Until ``done()``, at most ``timeout_s``, while every process that must stay up does."""
        deadline = time.monotonic() + timeout_s
        while not done():
            self.check_alive()
            assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f}s\n{self.logs()}"
            time.sleep(0.2)

    def step(self) -> int:
        last = checkpoint.latest(self.ckpt)
        return int(last.name.split("-")[1]) if last else 0

    def wait_step(self, step: int, what: str) -> None:
        self.wait(lambda: self.step() >= step, START_S if step <= 1 else STEPS_S, what)

    def get(self, host: Host, url: str) -> httpx.Response | None:
        """GET ``url`` from ``host``'s network; None when nothing answers there."""
        try:
            return host.call(lambda: httpx.get(url, timeout=5))
        except httpx.HTTPError:
            return None

    def rollout_status(self, host: Host) -> dict:
        response = self.get(host, host.url(ROLLOUT_PORT) + "/status")
        assert response is not None and response.status_code == 200, self.logs()
        return response.json()

    def live_version(self) -> int:
        def read() -> int:
            with redis.Redis.from_url(self.redis_url) as client:
                return int(client.get("policy:version") or 0)

        return self.a.call(read)

    def stop(self) -> None:
        _kill(self.nodes)
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(30)


def _metric(text: str, name: str) -> float:
    """The sum of a Prometheus metric's samples in ``text`` (every label set)."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
    return sum(float(v) for v in pattern.findall(text))


def _served(stack: Stack, url: str) -> float:
    """Completions the policy server at ``url`` (host B) finished since it started (0: none, or down)."""
    response = stack.get(stack.b, f"{url}/metrics")
    return 0 if response is None else _metric(response.text, "coda_inference_requests_total")


def _start(stack: Stack) -> str:
    """Redis, then both servers, both trainer nodes and both rollouts at once; returns once the first step is
    trained and each rollout has both servers up in its fleet (its own, and the other host's announced one).
    Returns policy server 2's URL."""
    a, b = stack.a, stack.b
    stack.start_redis()
    stack.wait(lambda: stack.a.call(_pong, stack.redis_url), START_S, "Redis answering on host A's address")
    urls = stack.start_server(a, "server1"), stack.start_server(b, "server2")
    stack.start_nodes()
    stack.start_rollout(a, "rollout1", seed=1)
    stack.start_rollout(b, "rollout2", seed=2)
    stack.wait_step(1, "the first step")

    def both_up(host: Host) -> bool:
        fleet = stack.rollout_status(host)["fleet"]["servers"]
        return sorted(fleet) == sorted(urls) and all(server["up"] for server in fleet.values())

    for host in (a, b):
        stack.wait(lambda host=host: both_up(host), START_S, f"the rollout on {host.name} sees both servers up")
    return urls[1]


def _pong(url: str) -> bool:
    with redis.Redis.from_url(url, socket_connect_timeout=1) as client:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False


def _server_killed(stack: Stack, url: str) -> None:
    """Policy server 2 SIGKILLed mid-run: training goes on."""
    stack.wait_step(3, "steps before policy server 2 is killed")
    stack.wait(lambda: _served(stack, url) > 0, STEPS_S, "episodes on policy server 2 before it is killed")
    server = stack.procs.pop("server2")
    server.send_signal(signal.SIGKILL)
    server.wait(30)
    killed_at = stack.step()
    stack.wait_step(killed_at + 3, "training after policy server 2 was killed")
    for host in (stack.a, stack.b):  # it is down (host B's rollout lists it) or gone (its announcement expired)
        seen = stack.rollout_status(host)["fleet"]["servers"].get(url)
        assert seen is None or not seen["up"], seen


def _server_back(stack: Stack, url: str) -> None:
    """Policy server 2 started again: it serves the live version before it finishes any completion (its own
    metrics, polled from the start), then takes episodes again; both rollouts see it at the live version."""
    live_before = stack.live_version()
    stack.start_server(stack.b, "server2")
    first: list[str] = []  # its /metrics when it had finished its first completions

    def served() -> bool:
        response = stack.get(stack.b, f"{url}/metrics")
        if response is not None and _metric(response.text, "coda_inference_requests_total") > 0:
            first.append(response.text)
        return bool(first)

    stack.wait(served, STEPS_S, "episodes on the restarted policy server 2")
    loads, version = (_metric(first[0], f"coda_inference_weight_{m}") for m in ("updates_total", "version"))
    print(
        f"restarted policy server 2: first completions at version {version:.0f} after {loads:.0f} loads "
        f"(live version {live_before} when it was started)"
    )
    assert loads >= 1 and version >= max(live_before, 1), first[0]

    for host in (stack.a, stack.b):

        def live(host: Host = host) -> bool:
            view = stack.rollout_status(host)["fleet"]
            return view["servers"].get(url, {}).get("version") == view["live_version"]

        stack.wait(live, STEPS_S, f"the rollout on {host.name} sees policy server 2 at the live version")


def _rank_killed(stack: Stack) -> int:
    """Trainer rank 1 (host B) SIGKILLed: both nodes exit in bounded time; the same commands resume. Returns
    the checkpoint step the run resumed from."""
    stack.wait_step(stack.step() + 2, "steps before trainer rank 1 is killed")
    killed = time.monotonic()
    _worker(stack.nodes[1]).send_signal(signal.SIGKILL)
    took = _ended(stack.nodes[0], killed, stack.tmp)
    assert stack.nodes[1].wait(30) != 0, stack.logs()
    assert "another rank died" in (stack.tmp / "node0.log").read_text(), stack.logs()
    print(f"trainer rank 1 killed: node 0 ended after {took:.1f}s")
    resumable = stack.step()
    stack.start_nodes()  # the same two commands
    stack.wait_step(max(resumable + 5, MIN_STEPS), "training after the resume")
    return resumable


def _stopped(stack: Stack) -> None:
    """Both ranks told to stop (SIGTERM, what torchrun forwards on Ctrl-C): both nodes exit 0."""
    for node in stack.nodes:
        _worker(node).send_signal(signal.SIGTERM)
    nodes, stack.nodes = stack.nodes, []  # ending now: no longer "must stay up"
    try:
        stack.wait(lambda: all(n.poll() is not None for n in nodes), STOP_S, "both nodes ending after SIGTERM")
        assert [n.returncode for n in nodes] == [0, 0], stack.logs()
    finally:
        stack.nodes = nodes


def _read_stream(url: str) -> list[TrajectoryGroup]:
    with redis.Redis.from_url(url) as client:
        return [decode(TrajectoryGroup, fields) for _, fields in client.xrange(STREAM)]


def _check_ledger(stack: Stack, resumable: int) -> None:
    resumed = re.findall(r"msg=resumed .*? step=(\d+)", (stack.tmp / "node0.log").read_text())
    assert [int(n) for n in resumed] == [resumable], resumed  # the second start continued from the checkpoint
    for host in (stack.a, stack.b):
        status = stack.rollout_status(host)
        assert status["dropped"] == 0 and not status["blamed_failures_by_cause"], status
        fleet = status["fleet"]
        print(f"rollout on {host.name}: published {status['published']}, fleet {fleet}")
    for name in ("rollout1", "rollout2"):  # the stream stops growing
        stack.procs[name].terminate()
        stack.procs.pop(name).wait(30)
    checks = _Ledger(stack.redis_url, stack.ckpt)
    ledger = stack.a.call(checks.ledger)
    checks.check_ledger_exact(ledger)  # none trained twice, none lost, none trained that was not served
    groups = stack.a.call(_read_stream, stack.redis_url)
    assert len({g.group_id for g in groups}) == len(groups), "a group was published twice"
    assert {len(g.samples) for g in groups} == {N_SAMPLES}, "a group was published in part"
    state = h.checkpoint_state(stack.ckpt)
    assert state["step"] >= max(resumable + 5, MIN_STEPS) and state["world"] == 2, state
    assert state["groups_trained"] >= state["step"] * PER_STEP, state


@pytest.mark.slow
@pytest.mark.timeout(1200)  # two two-node starts and two server starts; on a busy 2-core machine minutes each
def test_two_hosts_lose_a_policy_server_and_a_trainer_rank_and_train_every_group_once(tmp_path, hosts):
    a, b = hosts
    stack = Stack(tmp_path, a, b, tiny_model())
    began = time.monotonic()

    def done(phase: str) -> None:
        print(f"{time.monotonic() - began:6.1f}s  {phase} (checkpoint step {stack.step()})")

    try:
        server2 = _start(stack)
        done("started, first step trained")
        _server_killed(stack, server2)
        done("policy server 2 killed, training went on")
        _server_back(stack, server2)
        done("policy server 2 back at the live version, serving episodes")
        resumable = _rank_killed(stack)
        done(f"trainer rank 1 killed, the same commands resumed from step {resumable}, training went on")
        _stopped(stack)
        done("both ranks stopped")
        _check_ledger(stack, resumable)
        done("ledger checked")
    finally:
        stack.stop()
