"""Inference-server benchmark: batching speed-up and weight-update latency, measured side by side in one run.

    .venv/bin/python -m bench.inference [--sizes tiny small] [--requests 64] [--max-tokens 64]

For each model size: build it with the factory, start ``python -m services.inference serve`` as a child
process, send the same N requests one at a time and then all at once (throughput in generated tokens/s),
then time full-weight reloads (``/pause`` → ``/collective_rpc`` → ``/resume``) and LoRA load/unload on the
idle server, then agent-like multi-turn sessions with the prefix cache on and off (a second server).
Writes ``bench/results/inference.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from services.rollout.loader import load_weights, unload_adapter  # noqa: E402
from shared.inference_client import InferenceClient  # noqa: E402
from shared.redis_server import free_port  # noqa: E402


def build(root: Path, size: str) -> Path:
    from services.inference.factory import build_tiny_model, read_texts

    corpus = REPO / "data/hotpotqa/corpus.jsonl"
    return build_tiny_model(root / size, read_texts([corpus], limit=3000), size=size, seed=0)


def make_adapter(model_dir: Path, out: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    config = LoraConfig(r=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(out)
    return out


def prompts(count: int, vocab: int) -> list[list[int]]:
    import random

    rng = random.Random(0)
    return [[rng.randrange(10, vocab) for _ in range(rng.randrange(24, 64))] for _ in range(count)]


async def run_load(url: str, batch: list[list[int]], max_tokens: int, concurrent: bool) -> tuple[float, int]:
    async with InferenceClient(url) as llm:

        async def one(i: int, ids: list[int]):
            return await llm.complete("policy", ids, max_tokens=max_tokens, seed=i, ignore_eos=True)

        start = time.perf_counter()
        if concurrent:
            outs = await asyncio.gather(*[one(i, p) for i, p in enumerate(batch)])
        else:
            outs = [await one(i, p) for i, p in enumerate(batch)]
        seconds = time.perf_counter() - start
    return seconds, sum(len(c.token_ids) for o in outs for c in o.choices)


async def weight_updates(url: str, model_dir: Path, root: Path, adapter: Path, repeats: int) -> dict[str, float]:
    full = root / "full-copy"
    shutil.copytree(model_dir, full, dirs_exist_ok=True)
    timings: dict[str, list[float]] = {"full reload": [], "LoRA load": [], "LoRA unload": []}
    async with InferenceClient(url) as llm:
        for i in range(repeats):
            start = time.perf_counter()
            await load_weights(llm, "full", "policy", full, version=i + 1)
            timings["full reload"].append(time.perf_counter() - start)
            start = time.perf_counter()
            await load_weights(llm, "lora", f"policy-v{i}", adapter)
            timings["LoRA load"].append(time.perf_counter() - start)
            start = time.perf_counter()
            await unload_adapter(llm, f"policy-v{i}")
            timings["LoRA unload"].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in timings.items()}


async def multi_turn(url: str, sessions: int, turns: int, max_tokens: int) -> float:
    """Agent-like load: each turn's prompt is the previous prompt + its completion + 8 observation ids."""
    async with InferenceClient(url) as llm:

        async def session(i: int) -> None:
            ids = prompts(sessions, 4000)[i]
            for turn in range(turns):
                out = await llm.complete("policy", ids, max_tokens=max_tokens, seed=100 * i + turn, ignore_eos=True)
                ids = ids + out.choices[0].token_ids + [20 + turn] * 8

        start = time.perf_counter()
        await asyncio.gather(*[session(i) for i in range(sessions)])
        return time.perf_counter() - start


def start_server(model_dir: Path, root: Path, port: int, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "services.inference",
        "serve",
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--served-model-name",
        "policy",
        "--weights-root",
        str(root),
        "--max-num-seqs",
        "128",
        *extra,
    ]
    env = {**os.environ, "CODA_LOG_LEVEL": "WARNING"}
    return subprocess.Popen(cmd, cwd=REPO, env=env)


async def bench_size(size: str, root: Path, args: argparse.Namespace) -> dict:
    from services.inference.factory import count_parameters

    model_dir = build(root, size)
    adapter = make_adapter(model_dir, root / f"{size}-adapter")
    port = free_port()
    proc = start_server(model_dir, root, port)
    url = f"http://127.0.0.1:{port}"
    try:
        async with InferenceClient(url) as llm:
            await llm.wait_ready(180)
        batch = prompts(args.requests, 4000)
        await run_load(url, batch[:4], 8, True)  # warm-up
        seq_s, seq_tokens = await run_load(url, batch, args.max_tokens, concurrent=False)
        print(f"[{size}] one at a time: {seq_tokens} tokens in {seq_s:.1f}s", file=sys.stderr, flush=True)
        con_s, con_tokens = await run_load(url, batch, args.max_tokens, concurrent=True)
        print(f"[{size}] concurrent: {con_tokens} tokens in {con_s:.1f}s", file=sys.stderr, flush=True)
        updates = await weight_updates(url, model_dir, root, adapter, args.repeats)
        print(f"[{size}] weight updates: {updates}", file=sys.stderr, flush=True)
        cached_s = await multi_turn(url, args.sessions, args.turns, 32)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    uncached_s = await _multi_turn_without_cache(model_dir, root, args)
    print(f"[{size}] multi-turn: {cached_s:.1f}s cached vs {uncached_s:.1f}s uncached", file=sys.stderr)
    return {
        "size": size,
        "params": count_parameters(model_dir),
        "seq_tps": seq_tokens / seq_s,
        "con_tps": con_tokens / con_s,
        "seq_s": seq_s,
        "con_s": con_s,
        "tokens": con_tokens,
        "mt_cached": cached_s,
        "mt_uncached": uncached_s,
        **updates,
    }


async def _multi_turn_without_cache(model_dir: Path, root: Path, args: argparse.Namespace) -> float:
    port = free_port()
    proc = start_server(model_dir, root, port, "--prefix-cache-tokens", "0")
    try:
        async with InferenceClient(f"http://127.0.0.1:{port}") as llm:
            await llm.wait_ready(180)
        return await multi_turn(f"http://127.0.0.1:{port}", args.sessions, args.turns, 32)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def write_report(rows: list[dict], args: argparse.Namespace, path: Path, load: tuple[float, float]) -> None:
    lines = [
        "# Inference server benchmark",
        "",
        f"Written by `python -m bench.inference` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores (shared with other work), "
        f"CPU only. {args.requests} requests, prompts of 24–63 random token ids, {args.max_tokens} generated "
        "tokens each (ignore_eos), temperature 1, one seed per request. Load average (other work on the "
        f"machine) {load[0]:.1f} at the start, {load[1]:.1f} at the end: absolute tokens/s are depressed by it; "
        "the ratios are measured side by side.",
        "",
        "## Batching: the same requests one at a time vs all at once",
        "",
        "| model | params | one at a time (tok/s) | concurrent (tok/s) | speed-up | wall one-at-a-time / "
        "concurrent (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['size']} | {r['params'] / 1e6:.1f}M | {r['seq_tps']:.0f} | {r['con_tps']:.0f} | "
            f"**{r['con_tps'] / r['seq_tps']:.1f}×** | {r['seq_s']:.1f} / {r['con_s']:.1f} |"
        )
    lines += [
        "",
        "Target: ≥ 3× from batching (issue 4). Concurrent requests share one forward pass per decoding step "
        "(continuous batching over a right-aligned KV cache).",
        "",
        f"## Weight updates on the idle server (median of {args.repeats})",
        "",
        "| model | full reload: pause → collective_rpc → reset → resume (s) | LoRA load r=8 (s) | LoRA unload (s) |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['size']} | {r['full reload']:.3f} | {r['LoRA load']:.3f} | {r['LoRA unload']:.3f} |")
    lines += [
        "",
        "Full reload reads every `*.safetensors` of the directory, checks names and shapes, waits for "
        "in-flight requests, then copies in place; the times include the HTTP round trips of the client.",
        "",
        f"## Multi-turn sessions: prefix cache on vs off ({args.sessions} concurrent sessions × "
        f"{args.turns} turns, 32 tokens per turn, each prompt = previous prompt + completion + 8 ids)",
        "",
        "| model | prefix cache on (s) | off (s) | speed-up |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['size']} | {r['mt_cached']:.1f} | {r['mt_uncached']:.1f} | "
            f"**{r['mt_uncached'] / r['mt_cached']:.1f}×** |"
        )
    lines.append("")
    path.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=["tiny", "small", "base"])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--out", default=str(REPO / "bench/results/inference.md"))
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-inference-") as tmp:
        rows = [asyncio.run(bench_size(size, Path(tmp), args)) for size in args.sizes]
    write_report(rows, args, Path(args.out), (load_start, os.getloadavg()[0]))
    print(Path(args.out).read_text())


if __name__ == "__main__":
    main()
