"""The pieces of ``bench/fleet.py`` that are not its experiments: fake servers as processes, CPU meters, the
rollout's producer built as the app builds it (or without the fleet), a timed window of it, and the trainer's
side of a weight publish."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

from agents.prompts import CharTokenizer
from services.rollout.admission import Admission
from services.rollout.config import RolloutSettings
from services.rollout.embedding import make_embedder
from services.rollout.fleet import Fleet, FleetRunner
from services.rollout.fleet_watch import FleetWatch
from services.rollout.metrics import RolloutMetrics
from services.rollout.producer import Producer, PromptQueue
from services.rollout.runtime import agent_context
from shared.protocol import TrajectoryGroup, WeightUpdate
from shared.redis_server import free_port
from shared.stream import StreamQueue, encode

REPO = Path(__file__).resolve().parent.parent
TOK = CharTokenizer()
LOGS = REPO / "runs" / "bench-logs" / "fleet"


def spawn_fakes(count: int, tag: str, **opts: float) -> list[tuple[subprocess.Popen, str]]:
    """``count`` fake servers (``opts``: the fake's flags, ``token_delay_ms=…``), started, not yet healthy."""
    LOGS.mkdir(parents=True, exist_ok=True)
    flags = [x for k, v in opts.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    started = []
    for i in range(count):
        port = free_port()
        cmd = [sys.executable, "-m", "testing.fake_llm", "--port", str(port), "--no-record", *flags]
        with (LOGS / f"{tag}-{i}.log").open("w") as log:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        started.append((proc, f"http://127.0.0.1:{port}"))
    return started


class Meters:
    """CPU seconds of this process (the rollout), of the servers in use, of Redis, and the host's busy share."""

    def __init__(self, server_pids: list[int], redis_pid: int) -> None:
        self.servers = [psutil.Process(p) for p in server_pids]
        self.redis = psutil.Process(redis_pid)

    @staticmethod
    def _cpu(procs: list[psutil.Process]) -> float:
        return sum(t.user + t.system for t in (p.cpu_times() for p in procs))

    def snap(self) -> dict:
        host = psutil.cpu_times()
        idle = host.idle + getattr(host, "iowait", 0.0)
        return {
            "t": time.perf_counter(),
            "rollout": time.process_time(),
            "servers": self._cpu(self.servers),
            "redis": self._cpu([self.redis]),
            "host_idle": idle,
            "host_total": sum(host),
        }

    @staticmethod
    def rates(a: dict, b: dict) -> dict:
        wall = b["t"] - a["t"]
        total = b["host_total"] - a["host_total"]
        return {
            "rollout_cores": (b["rollout"] - a["rollout"]) / wall,
            "server_cores": (b["servers"] - a["servers"]) / wall,
            "redis_cores": (b["redis"] - a["redis"]) / wall,
            "host_busy": 1.0 - (b["host_idle"] - a["host_idle"]) / total if total else float("nan"),
        }


def settings_for(urls: list[str], redis_url: str, **overrides) -> RolloutSettings:
    base = dict(
        agent="single-turn",
        dataset="bundled:lookup",
        tokenizer="char",
        inference_url=urls[0],
        inference_urls=urls[1:],
        redis_url=redis_url,
        stream_maxlen=1000,
        retry_attempts=2,
        retry_backoff_s=0.05,
        http_timeout_s=120,
    )
    return RolloutSettings.load(**{**base, **overrides})


@contextlib.asynccontextmanager
async def rollout(settings: RolloutSettings, client, *, fleet: bool):
    """The producer as the app builds it (``fleet``) or as eval and direct construction do (one URL)."""
    async with agent_context(settings, tok=TOK) as ctx:
        watch = runner = task = None
        if fleet:
            watch = FleetWatch.for_settings(settings, ctx.policy.state, client)
            await watch.refresh()
            runner = FleetRunner(settings, ctx, watch.fleet, answers=watch.answers)
            task = asyncio.create_task(watch.run())
        producer = Producer(
            settings,
            ctx,
            publisher=StreamQueue(client, settings.stream, TrajectoryGroup, maxlen=settings.stream_maxlen),
            client=client,
            admission=Admission(10**9, 1, max_running=settings.max_running_groups),  # only the running cap
            metrics=RolloutMetrics(),
            embed=make_embedder(settings.embedder),
            prompts=PromptQueue(settings.records(), seed=settings.seed),
            fleet=runner,
        )
        try:
            yield producer
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await runner.aclose()
                await watch.aclose()


async def measure(producer: Producer, meters: Meters, warmup_s: float, window_s: float) -> dict:
    """Run the producer; count episodes finishing in the window (each, not per group); then drain it: no new
    group starts and those in flight finish, so the servers are idle for the next measurement."""
    done: list[tuple[float, int]] = []  # (seconds, generated tokens) per finished episode
    inner = producer._episode

    async def counted(record):
        episode, seconds = await inner(record)
        done.append((seconds, episode.main.generated_tokens))
        return episode, seconds

    producer._episode = counted
    task = asyncio.create_task(producer.run())
    await asyncio.sleep(warmup_s)
    n0, a = len(done), meters.snap()
    await asyncio.sleep(window_s)
    n1, b = len(done), meters.snap()
    producer.admission.max_running = 0
    deadline = time.monotonic() + 300
    while producer.admission.running and time.monotonic() < deadline and not task.done():
        await asyncio.sleep(0.02)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    window = done[n0:n1]
    return {
        "episodes": n1 - n0,
        "eps": (n1 - n0) / (b["t"] - a["t"]),
        "latency_s": statistics.median(s for s, _ in window) if window else float("nan"),
        "tokens": statistics.fmean(t for _, t in window) if window else float("nan"),
        "failed": producer.stats.failed,
        "cpu_ms_per_episode": 1000 * (b["rollout"] - a["rollout"]) / max(n1 - n0, 1),
        **Meters.rates(a, b),
    }


def trainer_publish(client, settings: RolloutSettings, version: int, path: str) -> None:
    """What ``services/trainer/publish.py`` does for a LoRA version once the folder is written: the version key
    and the event in one transaction (it loads nothing into servers: the rollout does)."""
    name = f"policy-v{version}"
    event = WeightUpdate(version=version, kind="lora", model_name=name, path=path, step=version, created_at=time.time())
    pipe = client.pipeline(transaction=True)
    pipe.set(settings.version_key, version)
    pipe.xadd(settings.weights_stream, encode(event), maxlen=10_000, approximate=True)
    pipe.execute()


async def all_serve(fleet: Fleet, version: int, timeout_s: float) -> None:
    deadline = time.perf_counter() + timeout_s
    while not all(s.version is not None and s.version >= version for s in fleet.servers.values()):
        if time.perf_counter() > deadline:
            raise TimeoutError(f"the fleet did not reach version {version} in {timeout_s:g} s")
        await asyncio.sleep(0.001)
