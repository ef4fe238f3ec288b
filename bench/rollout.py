"""Rollout orchestration benchmark: how close concurrent ``coda`` episodes get to the ideal episode rate.

Setup (all real processes on 127.0.0.1): the scripted fake LLM (``python -m testing.fake_llm``)
with a fixed per-call latency (default 20 ms), the real retriever serving the bundled HotpotQA index, and
the agents of ``agents.core`` driven from this process on uvloop (what uvicorn runs the service on).

A scripted ``coda`` episode is: planner ``<task>`` → executor ``<search>`` → retrieval → executor
``<answer>`` → planner ``<answer>``: 4 LLM calls and 1 retrieval on its critical path. With ``C`` episodes
kept in flight, the ideal rate is ``C / critical_path`` where ``critical_path = 4·delay + retrieval``
(the retriever's unloaded single-query latency, measured first). The rate reached is episodes finished in
a timed window ÷ the window. Orchestration overhead per episode is reported two ways: latency (unloaded
episode time − critical path) and CPU time this process spends per episode.

    .venv/bin/python -m bench.rollout                      # writes bench/results/rollout.md
    .venv/bin/python -m bench.rollout --concurrency 1 64 256 --seconds 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from agents import get_agent  # noqa: E402
from agents.core.episode import AgentContext  # noqa: E402
from agents.core.llm import PolicyGenerator, PolicyState, Sampling, _generation  # noqa: E402
from agents.core.turns import Budget  # noqa: E402
from agents.datasets import load_prompts  # noqa: E402
from agents.prompts import CharTokenizer, HFTokenizer  # noqa: E402
from shared.inference_client import (  # noqa: E402
    AiohttpCompletions,
    completion_body,
    parse_completion,
)
from shared.protocol.inference import CompletionRequest  # noqa: E402
from shared.redis_server import free_port  # noqa: E402
from shared.retriever_client import AsyncRetrieverClient, BatchingRetriever  # noqa: E402
from testing.fake_llm import FakeLLM, protocol_script  # noqa: E402
from testing.serving import wait_healthy  # noqa: E402

LLM_CALLS_ON_PATH = 4
RETRIEVALS_ON_PATH = 1


def ensure_index(out: Path) -> Path:
    if (out / "manifest.json").is_file():
        return out
    subprocess.run(
        [
            sys.executable,
            "-m",
            "services.retriever",
            "build",
            "--corpus",
            "data/hotpotqa/corpus.jsonl",
            "--embeddings",
            "data/hotpotqa/corpus_emb_all-MiniLM-L6-v2_fp16.npy",
            "--out",
            str(out),
            "--device",
            "cpu",
        ],
        cwd=REPO,
        check=True,
    )
    return out


def ensure_tokenizer(out: Path) -> Path:
    """A BPE tokenizer like a real model's (the tiny model factory's), so prompts have realistic lengths."""
    if not (out / "tokenizer.json").is_file():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "services.inference",
                "make-tiny",
                "--out",
                str(out),
                "--text",
                "data/hotpotqa/corpus.jsonl",
                "--max-texts",
                "3000",
                "--vocab-size",
                "4096",
            ],
            cwd=REPO,
            check=True,
        )
    return out


def start(cmd: list[str], url: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": ""}
    env.pop("PYTHONDONTWRITEBYTECODE")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(url, timeout_s=180)
    except TimeoutError:
        proc.terminate()
        raise SystemExit(f"{cmd[2]} did not start; see {log}") from None
    return proc


class InProcessLLM:
    """The same scripted fake, called without HTTP (asyncio.sleep for the latency): isolates what the
    agents themselves cost from what the HTTP client and server cost."""

    def __init__(self, tok, delay_s: float) -> None:
        self.fake, self.delay_s = FakeLLM(tok, protocol_script, record=False), delay_s
        self.fake_cpu_s = 0.0  # CPU spent inside the fake model itself (not part of the rollout's cost)

    async def generate(self, prompt_ids, *, stop, max_tokens):
        await asyncio.sleep(self.delay_s)
        body = completion_body("policy", list(prompt_ids), max_tokens=max_tokens, stop=list(stop))
        start = time.process_time()
        response = self.fake.complete(CompletionRequest.model_construct(**body)).model_dump()
        self.fake_cpu_s += time.process_time() - start
        out = parse_completion(response)
        return _generation(out.choices[0], 0)


def make_ctx(tok, llm_url: str, retriever_url: str, in_process_delay_s: float | None = None) -> AgentContext:
    policy = (
        InProcessLLM(tok, in_process_delay_s)
        if in_process_delay_s is not None
        else PolicyGenerator(AiohttpCompletions(llm_url), PolicyState(), Sampling())
    )
    budget = Budget(max_turns=3, max_tokens=256, max_obs_tokens=2048, max_context_tokens=16000)
    return AgentContext(
        tok=tok,
        policy=policy,
        retriever=BatchingRetriever(AsyncRetrieverClient(retriever_url, max_connections=512)),
        budgets={"planner": budget, "executor": budget},
        topk=3,
    )


async def retrieval_latency(ctx: AgentContext, questions: list[str], n: int = 40) -> float:
    samples = []
    inner = getattr(ctx.retriever, "inner", ctx.retriever)  # unloaded latency: no batching window
    for q in questions[:n]:
        t = time.perf_counter()
        await inner.retrieve([q], topk=3)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples[5:])


async def run_level(ctx: AgentContext, records, concurrency: int, seconds: float) -> dict:
    """Keep ``concurrency`` episodes in flight; count those finishing inside the timed window."""
    done: list[float] = []
    stop_at = time.perf_counter() + 1.0 + seconds  # 1 s warm-up, then the window
    window_start = time.perf_counter() + 1.0

    async def worker(k: int) -> None:
        i = k
        while time.perf_counter() < stop_at:
            t = time.perf_counter()
            episode = await get_agent("coda").run(ctx, records[i % len(records)])
            assert episode.answer is not None and episode.children, "the scripted episode did not complete"
            if window_start <= time.perf_counter() <= stop_at:
                done.append(time.perf_counter() - t)
            i += concurrency

    fake_before = getattr(ctx.policy, "fake_cpu_s", 0.0)
    cpu = time.process_time()
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    cpu = time.process_time() - cpu - (getattr(ctx.policy, "fake_cpu_s", 0.0) - fake_before)
    elapsed = seconds
    return {
        "concurrency": concurrency,
        "episodes": len(done),
        "rate": len(done) / elapsed,
        "latency_s": statistics.median(done) if done else float("nan"),
        "cpu_ms_per_episode": 1000 * cpu / max(len(done), 1) * seconds / (seconds + 1.0),
    }


async def bench(args) -> list[dict]:
    llm_url, retriever_url = f"http://127.0.0.1:{args.llm_port}", f"http://127.0.0.1:{args.retriever_port}"
    records = load_prompts("bundled:hotpotqa")
    tok = CharTokenizer() if args.tokenizer == "char" else HFTokenizer(str(args.tokenizer))
    rows = []
    for variant in ("http", "in-process"):
        ctx = make_ctx(tok, llm_url, retriever_url, None if variant == "http" else args.delay_ms / 1000)
        retrieval = await retrieval_latency(ctx, [r.question for r in records])
        for c in args.concurrency:
            rows.append(await level(ctx, records, c, args, retrieval, variant))
        for client in (getattr(ctx.policy, "client", None), ctx.retriever):
            if hasattr(client, "aclose"):
                await client.aclose()
    return rows


async def level(ctx: AgentContext, records, c: int, args, retrieval: float, variant: str) -> dict:
    critical = LLM_CALLS_ON_PATH * args.delay_ms / 1000 + RETRIEVALS_ON_PATH * retrieval
    load = os.getloadavg()[0]
    row = await run_level(ctx, records, c, args.seconds)
    row.update(
        ideal=c / critical,
        critical_path_s=critical,
        retrieval_s=retrieval,
        variant=variant,
        load=(load + os.getloadavg()[0]) / 2,
    )
    row["ratio"] = row["rate"] / row["ideal"]
    row["overhead_ms"] = 1000 * (row["latency_s"] - critical)
    print(
        f"{variant:10s} C={c:4d}  rate {row['rate']:8.1f}/s  ideal {row['ideal']:8.1f}/s  "
        f"ratio {row['ratio']:.2f}  "
        f"latency {1000 * row['latency_s']:.1f} ms  cpu/episode {row['cpu_ms_per_episode']:.2f} ms",
        flush=True,
    )
    return row


def write_report(rows: list[dict], args, path: Path) -> None:
    crit = rows[0]["critical_path_s"]
    lines = [
        "# Rollout orchestration benchmark (`bench/rollout.py`)",
        "",
        f"Written by the script on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; host: {os.cpu_count()} "
        f"CPU cores (shared with other work while it ran), no GPU.",
        f"Fake LLM with a fixed {args.delay_ms:.0f} ms per call (separate process), the real retriever "
        f"(`--mode {args.retriever_mode}` over the 6,785-passage HotpotQA corpus, separate process), scripted `coda` "
        "episodes (planner task → executor search → executor answer → planner answer) driven by "
        f"`agents.core` on uvloop in the benchmark process; tokenizer: "
        f"{'one id per character' if args.tokenizer == 'char' else 'a 4096-token BPE with a chat template (the tiny-model factory)'}.",
        "",
        f"Critical path of one episode: {LLM_CALLS_ON_PATH} × {args.delay_ms:.0f} ms LLM + "
        f"{1000 * rows[0]['retrieval_s']:.1f} ms retrieval (unloaded median, measured before each variant) "
        f"= **{1000 * crit:.1f} ms**. "
        "Ideal rate = concurrency ÷ critical path.",
        "",
        "`http`: the agents call the fake LLM over HTTP with the rollout's LLM transport "
        "(`shared.inference_client.AiohttpCompletions`: aiohttp, with the client's request body and parser; the "
        "production path). `in-process`: the same fake called directly after an `asyncio.sleep` of the same latency "
        "(no HTTP for the LLM; the retrieval stays HTTP) — what the agents themselves cost. The CPU column "
        "is this process's CPU time per finished episode; for `in-process` the fake model's own work is "
        "subtracted, so it is the agents' orchestration (turn engine, token bookkeeping, request building and "
        "parsing, the batched retriever client).",
        "",
        "| LLM path | concurrent episodes | episodes in window | rate (ep/s) | ideal (ep/s) | rate / ideal | "
        "median episode latency (ms) | latency overhead per episode (ms) | rollout CPU per episode (ms) | "
        "rollout cores the ideal rate needs | host load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['concurrency']} | {r['episodes']} | {r['rate']:.1f} | "
            f"{r['ideal']:.1f} | **{r['ratio']:.2f}** | {1000 * r['latency_s']:.1f} | "
            f"{r['overhead_ms']:.1f} | {r['cpu_ms_per_episode']:.2f} | "
            f"{r['ideal'] * r['cpu_ms_per_episode'] / 1000:.2f} | {r['load']:.1f} |"
        )
    lines += [
        "",
        f'Window: {args.seconds:.0f} s per level after 1 s of warm-up. "Rollout cores the ideal rate '
        'needs" = ideal rate × rollout CPU per episode: where it exceeds the CPU this process can get '
        "(one core at most, less on a shared host), the rate is CPU-bound, not latency-bound, and more "
        "concurrency cannot help; run more rollout processes on a host with more cores.",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--seconds", type=float, default=6.0, help="timed window per level")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="fake LLM latency per call")
    parser.add_argument(
        "--tokenizer",
        default=str(REPO / "runs" / "bench-tokenizer"),
        help="tokenizer directory (built with the tiny-model factory if missing) or 'char'",
    )
    parser.add_argument(
        "--retriever-mode",
        choices=["sparse", "hybrid", "dense"],
        default="sparse",
        help="retriever mode (default sparse: on a CPU-only host MiniLM query encoding would "
        "dominate the critical path and the benchmark would measure the encoder)",
    )
    parser.add_argument("--index", type=Path, default=REPO / "runs" / "bench-index" / "hotpotqa")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "rollout.md")
    args = parser.parse_args()
    args.llm_port, args.retriever_port = free_port(), free_port()
    index = ensure_index(args.index)
    if args.tokenizer != "char":
        args.tokenizer = str(ensure_tokenizer(Path(args.tokenizer)))
    logs = REPO / "runs" / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs = [
        start(
            [
                sys.executable,
                "-m",
                "services.retriever",
                "serve",
                "--index",
                str(index),
                "--port",
                str(args.retriever_port),
                "--host",
                "127.0.0.1",
                "--device",
                "cpu",
                "--mode",
                args.retriever_mode,
            ],
            f"http://127.0.0.1:{args.retriever_port}",
            logs / "retriever.log",
        ),
        start(
            [
                sys.executable,
                "-m",
                "testing.fake_llm",
                "--port",
                str(args.llm_port),
                "--delay-ms",
                str(args.delay_ms),
                "--no-record",
                "--tokenizer",
                args.tokenizer,
            ],
            f"http://127.0.0.1:{args.llm_port}",
            logs / "fake-llm.log",
        ),
    ]
    try:
        import uvloop

        rows = uvloop.run(bench(args))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=20)
    write_report(rows, args, args.out)


if __name__ == "__main__":
    main()
