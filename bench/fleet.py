"""Fleet benchmark: the rollout's episodes/s against the number of policy servers, the time a new weight version
takes to reach every server, and what the fleet costs at one server against the old single-URL path.

Setup (all real processes on 127.0.0.1): scripted fake policy servers (``python -m testing.fake_llm``) that
take a fixed time per generated token and serve at most ``--max-num-seqs`` requests at once (more wait, as on
vLLM), so each server has a fixed capacity; a private ``redis-server``; and the rollout's ``Producer`` in this
process on uvloop, wired as ``services/rollout/app.py`` wires it (``FleetWatch`` + ``FleetRunner``), scoring
episodes and publishing real trajectory groups to Redis.

The agent is ``single-turn`` on ``bundled:lookup`` (short questions): one completion per episode and no
retriever, the least rollout CPU per episode of the recipes (``coda`` makes 4 LLM calls and a retrieval per
episode, the recursive reasoner 4 calls), so that the servers, not the rollout's one event loop, set the pace.
Every completion is capped at ``--tokens`` tokens (the scripted reply is longer), so every episode costs a
server the same time.

1. Scaling: episodes/s at N = 1, 2, 4, 8, 16 servers with everything else fixed, among it the episodes in
   flight (``--in-flight-factor`` × the largest N × ``--max-num-seqs``: a queue at every server even at the
   largest N). Reported against linear scaling, eps(N) / (N · eps(1)), with the CPU the rollout, the servers,
   Redis and the host used (a 2-core host runs out of CPU before 16 servers do).
2. Publish: for N = 1 and 4, the time from the trainer's weight event (a LoRA adapter: a fake adapter folder)
   until the rollout's fleet view has every server at the new version, the rollout loading it into every
   server (the trainer loads none).
3. Overhead: the fleet at N = 1 against the ``Producer`` built without ``fleet=``, same server and prompts,
   alternating A B B A …, in a rollout-CPU-bound mode (a zero-latency server, many episodes in flight) and a
   latency-bound one (one episode in flight).

    .venv/bin/python -m bench.fleet                                       # bench/results/fleet.md (~6 min)
    .venv/bin/python -m bench.fleet --quick --out /tmp/fleet-quick.md     # smoke: N in {1, 2}, < 1 min
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
from bench import _fleet_report as report  # noqa: E402
from bench._fleet_parts import TOK, Meters, all_serve, measure, rollout, settings_for, spawn_fakes, trainer_publish  # noqa: E402
from services.rollout.config import RolloutSettings  # noqa: E402
from services.rollout.fleet_watch import SYNC_RETRY_S  # noqa: E402
from services.rollout.runtime import agent_context  # noqa: E402
from services.rollout.weight_sync import WeightSync  # noqa: E402
from shared.redis_server import RedisServer  # noqa: E402
from testing.serving import wait_healthy  # noqa: E402


async def scaling(args, fakes, redis: RedisServer, client) -> list[dict]:
    rows = []
    for n in args.servers:
        client.flushall()
        settings = settings_for(
            [url for _, url in fakes[:n]],
            redis.url,
            n_samples=args.n_samples,
            max_running_groups=args.groups,
            max_tokens_per_turn=args.tokens,
        )
        meters = Meters([p.pid for p, _ in fakes[:n]], redis.proc.pid)
        async with rollout(settings, client, fleet=True) as producer:
            row = {"servers": n, **await measure(producer, meters, args.warmup_s, args.window_s)}
        print(
            f"scaling  N={n:2d}  {row['eps']:7.1f} episodes/s  ({row['episodes']} in {args.window_s:g} s, "
            f"{row['tokens']:.0f} tokens each)  latency {row['latency_s']:.2f} s  rollout {row['rollout_cores']:.2f} "
            f"cores  servers {row['server_cores']:.2f}  host {100 * row['host_busy']:.0f}% busy",
            flush=True,
        )
        rows.append(row)
    return rows


async def publish_run(args, urls: list[str], redis: RedisServer, client, adapter: str, first: int) -> list[dict]:
    """Versions ``first``, ``first + 1``, … published to a fresh rollout over ``urls``; one sample each."""
    client.flushall()
    settings = settings_for(urls, redis.url)
    async with agent_context(settings, tok=TOK) as ctx:
        sync = WeightSync(settings, ctx.policy.state, client)  # what the app runs beside the producer
        await sync.start()
        tasks = sync.tasks()
        gaps = [args.gap_s] * args.versions + ([args.fast_gap_s] if args.fast_gap_s else [])
        samples, last = [], -math.inf
        try:
            for k, gap in enumerate(gaps):
                await asyncio.sleep(max(0.0, last + gap - time.monotonic()))
                last, t0, loads = time.monotonic(), time.perf_counter(), sync.watch.loads
                await asyncio.to_thread(trainer_publish, client, settings, first + k, adapter)
                t1 = time.perf_counter()
                await all_serve(sync.fleet, first + k, timeout_s=SYNC_RETRY_S + 30)
                t2 = time.perf_counter()
                samples.append(
                    {"event": t2 - t1, "total": t2 - t0, "loads": sync.watch.loads - loads, "fast": k >= args.versions}
                )
                print(f"publish  N={len(urls)}  v{first + k}  event → all serve {1000 * (t2 - t1):7.1f} ms", flush=True)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await sync.aclose()
    return samples


async def publish(args, fakes, redis: RedisServer, client) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="fake-adapter-") as adapter:
        (Path(adapter) / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
        for k, n in enumerate(args.publish_servers):
            samples = await publish_run(args, [u for _, u in fakes[:n]], redis, client, adapter, 1000 * (k + 1))
            for fast in (False, True):
                chosen = [s for s in samples if s["fast"] == fast]
                if chosen:
                    rows.append(
                        {
                            "servers": n,
                            "fast": fast,
                            "event": report.spread([s["event"] for s in chosen]),
                            "total": report.spread([s["total"] for s in chosen]),
                            "loads": sum(s["loads"] for s in chosen),
                        }
                    )
    return rows


async def overhead_mode(args, name: str, describe: str, fake, redis: RedisServer, client, **over) -> dict:
    runs = []
    for label in report.abba(args.reps):
        variant = "fleet" if label == "A" else "single"
        client.flushall()
        settings = settings_for([fake[1]], redis.url, max_tokens_per_turn=args.tokens, **over)
        async with rollout(settings, client, fleet=variant == "fleet") as producer:
            # Bounded: one full run's first cpu-bound window never ended (2026-11-27, not yet understood).
            row = await asyncio.wait_for(
                measure(producer, Meters([fake[0].pid], redis.proc.pid), args.ab_warmup_s, args.ab_window_s),
                args.ab_warmup_s + args.ab_window_s + 120,
            )
        runs.append({"variant": variant, **row})
        print(
            f"overhead {name:13s} {variant:6s} {row['eps']:7.1f} episodes/s  cpu/episode "
            f"{row['cpu_ms_per_episode']:.2f} ms  rollout {row['rollout_cores']:.2f} cores  server "
            f"{row['server_cores']:.2f}  failed groups {row['failed']}",
            flush=True,
        )
    return {"name": name, "describe": describe, "runs": runs, "summary": report.overhead(runs)}


async def bench(args, fakes: dict, redis: RedisServer) -> dict:
    client = redis.client()
    try:
        scale = await scaling(args, fakes["scale"], redis, client)
        pub = await publish(args, fakes["scale"], redis, client)
        cpu = await overhead_mode(
            args,
            "cpu-bound",
            f"a server with no latency and no cap, {args.ab_groups} groups × {args.n_samples} samples in flight: "
            "the rollout's own CPU sets the rate, so the fleet's per-episode cost shows in full",
            fakes["fast"][0],
            redis,
            client,
            n_samples=args.n_samples,
            max_running_groups=args.ab_groups,
        )
        lat = await overhead_mode(
            args,
            "latency-bound",
            f"a server with {args.ab_delay_ms:g} ms per request, one episode in flight (1 group × 1 sample): the "
            "rate is 1 / (episode latency + scoring and publishing), so the fleet's added latency shows",
            fakes["slow"][0],
            redis,
            client,
            n_samples=1,
            max_running_groups=1,
        )
    finally:
        client.close()
    return {"scaling": scale, "publish": pub, "overhead": [cpu, lat]}


def write_report(result: dict, args, path: Path, command: str) -> None:
    service_s = args.tokens * args.token_delay_ms / 1000
    cfg = {
        "slots": args.max_num_seqs,
        "tokens": args.tokens,
        "token_ms": args.token_delay_ms,
        "service_s": service_s,
        "capacity": args.max_num_seqs / service_s,
        "in_flight": args.groups * args.n_samples,
        "groups": args.groups,
        "n_samples": args.n_samples,
        "factor": args.in_flight_factor,
        "max_n": max(args.servers),
        "window_s": args.window_s,
        "warmup_s": args.warmup_s,
        "load_ms": args.load_delay_ms,
        "probe_s": RolloutSettings.model_fields["fleet_probe_s"].default,
        "gap_s": args.gap_s,
        "fast_gap_s": args.fast_gap_s,
        "retry_s": SYNC_RETRY_S,
    }
    cpu = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in line), "")
    lines = [
        "# Fleet benchmark (`bench/fleet.py`)",
        "",
        f"Written by the script on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; host: {platform.node()}, "
        f"{os.cpu_count()} CPU cores ({cpu.split(':')[-1].strip() or 'unknown CPU'}), "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, no GPU needed; load average before the run "
        f"{args.load_before:.1f}.",
        "",
        f"Command: `{command}`",
        "",
        "Fake policy servers (`python -m testing.fake_llm`, one process each), a private `redis-server`, and the "
        "rollout's `Producer` in the benchmark process on uvloop, built as `services/rollout/app.py` builds it "
        "(`FleetWatch` + `FleetRunner`) and publishing real trajectory groups to Redis. Agent `single-turn` on "
        "`bundled:lookup` with the one-id-per-character tokenizer: one completion per episode and no retriever, "
        "the least rollout CPU per episode of the recipes, so that the servers set the pace where the host "
        "allows it. CPU columns: cores used during the window (CPU seconds ÷ wall seconds); the rollout is one "
        "event loop, so about 1 core is its ceiling.",
        "",
    ]
    rows = report.with_scaling(result["scaling"], cfg["capacity"])
    lines += report.scaling_section(rows, cfg)
    lines += report.publish_section(result["publish"], cfg)
    lines += report.overhead_section(result["overhead"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a smoke: N in {1, 2}, short windows, one A/B pair (< 1 min)")
    p.add_argument("--servers", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="fleet sizes (must include 1)")
    p.add_argument("--token-delay-ms", type=float, default=15.0, help="fake server latency per generated token")
    p.add_argument("--tokens", type=int, default=32, help="tokens generated per episode (max_tokens_per_turn)")
    p.add_argument("--max-num-seqs", type=int, default=4, help="requests one fake server serves at once")
    p.add_argument("--n-samples", type=int, default=4, help="episodes per group")
    p.add_argument("--in-flight-factor", type=float, default=2.0, help="episodes in flight ÷ (max N × slots)")
    p.add_argument("--warmup-s", type=float, default=3.0)
    p.add_argument(
        "--window-s", type=float, default=15.0, help="timed window per fleet size (rounded to whole service times)"
    )
    p.add_argument("--publish-servers", type=int, nargs="+", default=[1, 4])
    p.add_argument("--versions", type=int, default=3, help="weight versions timed per fleet size")
    p.add_argument("--load-delay-ms", type=float, default=100.0, help="fake server time per adapter load")
    p.add_argument("--gap-s", type=float, default=SYNC_RETRY_S + 1, help="between two timed versions")
    p.add_argument("--fast-gap-s", type=float, default=2.0, help="one more version this soon after (0: none)")
    p.add_argument("--reps", type=int, default=4, help="A/B repetitions of the overhead comparison")
    p.add_argument("--ab-groups", type=int, default=16, help="groups in flight, overhead cpu-bound mode")
    p.add_argument("--ab-delay-ms", type=float, default=20.0, help="per-request latency, overhead latency mode")
    p.add_argument("--ab-warmup-s", type=float, default=2.0)
    p.add_argument("--ab-window-s", type=float, default=8.0)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "fleet.md")
    args = p.parse_args(argv)
    if args.quick:
        args.servers, args.publish_servers, args.versions, args.fast_gap_s = [1, 2], [1, 2], 1, 0.0
        args.warmup_s, args.window_s, args.reps, args.ab_warmup_s, args.ab_window_s = 1.0, 3.0, 1, 0.5, 2.0
    if 1 not in args.servers:
        p.error("--servers must include 1 (scaling is judged against one server)")
    args.groups = math.ceil(args.in_flight_factor * max(args.servers) * args.max_num_seqs / args.n_samples)
    # Episodes that start together finish together (every service time): a window of whole service times
    # counts the same number of such batches wherever it starts.
    service_s = args.tokens * args.token_delay_ms / 1000
    if service_s > 0:
        args.window_s = max(1, round(args.window_s / service_s)) * service_s
    args.load_before = os.getloadavg()[0]
    return args


def main() -> None:
    args = parse()
    command = " ".join([".venv/bin/python", "-m", "bench.fleet", *sys.argv[1:]])
    count = max([*args.servers, *args.publish_servers])
    with RedisServer() as redis:
        fakes: dict[str, list] = {}
        try:
            fakes["scale"] = spawn_fakes(
                count,
                "scale",
                tokenizer="char",
                token_delay_ms=args.token_delay_ms,
                max_num_seqs=args.max_num_seqs,
                load_delay_ms=args.load_delay_ms,
            )
            fakes["fast"] = spawn_fakes(1, "fast", tokenizer="char")
            fakes["slow"] = spawn_fakes(1, "slow", tokenizer="char", delay_ms=args.ab_delay_ms)
            for _, url in (f for group in fakes.values() for f in group):
                wait_healthy(url, timeout_s=180)
            import uvloop

            result = uvloop.run(bench(args, fakes, redis))
        finally:
            procs = [proc for group in fakes.values() for proc, _ in group]
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=20)
    write_report(result, args, args.out, command)


if __name__ == "__main__":
    main()
