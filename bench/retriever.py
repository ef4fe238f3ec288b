"""Retriever benchmark: writes ``bench/results/retriever.md`` and the retriever section of ``peers.md``.

Default run (about 8 minutes on 2 shared cores): our server against a thread-per-request baseline built the
way Search-R1's ``retrieval_server.py`` (and FlashRAG's) are: a plain FastAPI ``def`` route that tokenises,
encodes (Hugging Face AutoModel, mean pooling, L2 normalisation) and searches the FAISS index per request,
in FastAPI's thread pool, torch and FAISS at their library defaults. Same encoder (all-MiniLM-L6-v2), same
FAISS Flat index, same corpus (the bundled 6,785 HotpotQA passages), our server in ``mode=dense``, topk 3.
Each client sends its requests one after the other; every query in a run is distinct (drawn without
replacement), so our duplicate-query merging never helps. Settings: 1, 16 and 64 clients × 1 and 32 queries
per request; the two servers run one setting after the other (order alternating), repeated ``--reps``
times; tables give min / median / max over the repetitions. A request not answered within
``--request-timeout`` counts as unanswered.

``--libraries`` adds the older sections: bm25s vs rank-bm25 and dense vs sparse vs hybrid in-process, at the
bundled corpus and at a synthetic one (``--docs`` passages).

    python -m bench.retriever                       # the fair comparison (default)
    python -m bench.retriever --libraries --docs 20000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench._retriever_corpus import ROOT, build, bundled, distinct, pct
from bench._retriever_libraries import libraries

BASELINE = "bench._retriever_baseline"  # the thread-per-request peer server, run as a module


def _wait_ready(url: str, server: subprocess.Popen) -> None:
    import httpx

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("retriever server exited during startup")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("retriever server did not become ready")


# ---------------------------------------------------------------- 4. fair comparison with a thread-per-request baseline


WARM_CONNECTIONS = 8  # untimed requests before each run (all 64 warm: the same 64 × 1 tail, measured)
THREAD_VARS = {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TORCH_NUM_THREADS"}
SETTINGS = ((1, 1, 120), (16, 1, 8), (64, 1, 4), (1, 32, 8), (16, 32, 1), (64, 32, 1))  # clients, q/req, req/client


async def drive(
    url: str, pool: list[str], clients: int, per_request: int, each: int, timeout: float, mode: str | None
) -> dict:
    """Closed-loop load; every query distinct. → latencies of answered requests, unanswered count, q/s."""
    import httpx

    needed = clients * per_request * each
    assert needed <= len(pool), f"pool of {len(pool)} queries is too small for {needed}"
    draw = iter(np.random.default_rng(len(pool) + needed).permutation(len(pool))[:needed].tolist())
    latencies, unanswered = [], 0

    async def client(session):
        nonlocal unanswered
        for _ in range(each):
            body = {"queries": [pool[next(draw)] for _ in range(per_request)], "topk": 3, "return_scores": True}
            if mode:
                body["mode"] = mode
            t = time.perf_counter()
            try:
                r = await session.post(url + "/retrieve", json=body)
                ok = r.status_code == 200 and len(r.json()["result"]) == per_request
            except httpx.HTTPError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - t)
            else:
                unanswered += 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as session:
        # Untimed: open the connections and let the server settle after the previous run (the other server's
        # last setting may have just ended), the same for both servers.
        warm = [{"queries": [f"warm-up query {i}"], "topk": 3} for i in range(min(clients, WARM_CONNECTIONS))]
        await asyncio.gather(*(session.post(url + "/retrieve", json=body) for body in warm))
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        wall = time.perf_counter() - start
    answered = len(latencies)
    return {
        "qps": answered * per_request / wall,
        "p50": pct(latencies, 50) if latencies else float("nan"),
        "p99": pct(latencies, 99) if latencies else float("nan"),
        "unanswered": unanswered,
        "requests": clients * each,
    }


def _start(cmd: list[str], url: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    # Both servers as they ship: thread counts from their own defaults, never from the caller's shell.
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS} | {"CODA_LOG_LEVEL": "WARNING"}
    env |= extra_env or {}
    server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_ready(url, server)
    return server


def _encoder_runtime(dtype: str) -> str:
    """How our server encodes queries on this host with ``encoder_dtype = dtype`` (see services/retriever/encoder)."""
    from services.retriever.encoder import BF16_ONNX_MAX_QUERIES, pick_dtype

    resolved = pick_dtype(dtype, "cpu")
    if resolved == "bfloat16":
        return f"here: bf16 torch, passes of 1-{BF16_ONNX_MAX_QUERIES} queries on fp32 ONNX Runtime"
    return f"here: {resolved} ONNX Runtime"


def compare(
    index_dir: Path, pool: list[str], reps: int, timeout: float, cpu_threads: int, encoder_dtype: str = "auto"
) -> tuple[list, dict]:
    """Interleaved runs of both servers → (markdown rows, {setting: {server: [runs]}})."""
    from shared.redis_server import free_port

    ports = {"ours": free_port(), "baseline": free_port()}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    ours_cmd = [
        sys.executable,
        "-m",
        "services.retriever",
        "serve",
        "--index",
        str(index_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(ports["ours"]),
        "--mode",
        "dense",
    ]
    if cpu_threads:
        ours_cmd += ["--cpu-threads", str(cpu_threads)]
    ours_env = {"CODA_RETRIEVER_ENCODER_DTYPE": encoder_dtype}
    base_cmd = [sys.executable, "-m", BASELINE, "--index", str(index_dir), "--port", str(ports["baseline"])]
    servers = {"ours": _start(ours_cmd, urls["ours"], ours_env), "baseline": _start(base_cmd, urls["baseline"])}
    runs: dict = {}
    try:
        for rep in range(reps):
            for clients, per_request, each in SETTINGS:
                order = ("ours", "baseline") if (rep + clients + per_request) % 2 == 0 else ("baseline", "ours")
                for name in order:
                    out = asyncio.run(
                        drive(
                            urls[name], pool, clients, per_request, each, timeout, "dense" if name == "ours" else None
                        )
                    )
                    runs.setdefault((clients, per_request), {}).setdefault(name, []).append(out)
                    print(f"rep {rep} {clients}x{per_request} {name}: {out}", flush=True)
    finally:
        for server in servers.values():
            server.terminate()
            server.wait(timeout=60)
    return runs


def mmm(values: list[float], fmt: str) -> str:
    v = sorted(values)
    return f"{fmt.format(v[0])} / **{fmt.format(v[len(v) // 2])}** / {fmt.format(v[-1])}"


def comparison_rows(runs: dict) -> list[str]:
    rows = []
    for (clients, per_request), by in runs.items():
        ours, base = by["ours"], by["baseline"]
        qps_ratio = [o["qps"] / b["qps"] for o, b in zip(ours, base, strict=True)]
        p99_ratio = [o["p99"] / b["p99"] for o, b in zip(ours, base, strict=True)]
        lost = (
            f"{sum(o['unanswered'] for o in ours)} / {sum(b['unanswered'] for b in base)} of "
            f"{sum(o['requests'] for o in ours)}"
        )
        rows.append(
            f"| {clients} × {per_request} | {mmm([o['qps'] for o in ours], '{:,.0f}')} | "
            f"{mmm([b['qps'] for b in base], '{:,.0f}')} | {mmm(qps_ratio, '{:.2f}×')} | "
            f"{mmm([o['p99'] for o in ours], '{:,.0f}')} | {mmm([b['p99'] for b in base], '{:,.0f}')} | "
            f"{mmm(p99_ratio, '{:.2f}×')} | {lost} |"
        )
    return rows


COMPARISON_HEADER = (
    "| clients × queries/request | ours q/s | baseline q/s | q/s ratio | ours p99 ms | "
    "baseline p99 ms | p99 ratio | unanswered (ours / baseline) |\n"
    "|---|---|---|---|---|---|---|---|"
)


def write_peers(path: Path, section: str) -> None:
    """Replace (or add) the retriever section of peers.md, leaving other sections alone."""
    text = path.read_text() if path.exists() else "# Peer comparisons\n"
    marker = "## Retriever"
    if marker in text:
        head, _, rest = text.partition(marker)
        nxt = rest.find("\n## ")
        text = head + section + (rest[nxt + 1 :] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n")


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="repetitions of the interleaved comparison")
    parser.add_argument(
        "--request-timeout", type=float, default=120.0, help="seconds before a request counts as unanswered"
    )
    parser.add_argument("--cpu-threads", type=int, default=0, help="our server's cpu_threads (0: its default)")
    parser.add_argument(
        "--encoder-dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="our server's encoder_dtype (auto: as shipped; float32 compares at the baseline's precision)",
    )
    parser.add_argument("--libraries", action="store_true", help="also the older library and mode sections")
    parser.add_argument("--docs", type=int, default=200_000, help="synthetic corpus size (--libraries)")
    parser.add_argument("--rank-queries", type=int, default=20, help="queries timed on rank-bm25 (--libraries)")
    parser.add_argument("--threads", type=int, default=1, help="cpu_threads for the in-process sections")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "retriever.md")
    parser.add_argument("--peers", type=Path, default=ROOT / "bench" / "results" / "peers.md")
    args = parser.parse_args()
    os.environ.setdefault("CODA_LOG_LEVEL", "WARNING")
    from shared.log import configure_logging

    configure_logging()
    work = Path(tempfile.mkdtemp(prefix="retriever-bench-"))
    load = os.getloadavg()[0]
    corpus, emb, questions = bundled()
    index_dir = work / "bundled"
    build(corpus, emb, index_dir)
    pool = distinct(questions, 4096)
    started = time.perf_counter()
    runs = compare(index_dir, pool, args.reps, args.request_timeout, args.cpu_threads, args.encoder_dtype)
    minutes = (time.perf_counter() - started) / 60
    what = (
        f"Written by `python -m bench.retriever` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; host: "
        f"{os.cpu_count()} CPU cores (load average {load:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at the end, the bench's own servers and clients included), {args.reps} interleaved repetitions in {minutes:.1f} min. "
        "Corpus: the bundled 6,785 HotpotQA passages; encoder all-MiniLM-L6-v2 on CPU; FAISS Flat; topk 3; "
        f"our server `mode=dense`, cpu_threads {args.cpu_threads or 'default (one worker per CPU)'}, "
        f"encoder_dtype {args.encoder_dtype} ({_encoder_runtime(args.encoder_dtype)}); "
        "baseline: thread-per-request FastAPI route as in Search-R1's retrieval_server.py (Hugging Face "
        "AutoModel + mean pooling, torch/FAISS library defaults). Every query distinct (drawn without "
        f"replacement from {len(pool):,}). Requests per setting: "
        + ", ".join(f"{c} × {q}: {c * e}" for c, q, e in SETTINGS)
        + f"; a request not answered within {args.request_timeout:.0f} s counts as unanswered. Cells: "
        "min / **median** / max over the repetitions; ratios are per repetition (ours ÷ baseline, "
        "measured back to back)."
    )
    table = "\n".join([COMPARISON_HEADER, *comparison_rows(runs)])
    lines = [
        "# Retriever benchmark",
        "",
        "## Against a thread-per-request baseline (Search-R1 style)",
        "",
        what,
        "",
        table,
        "",
    ]
    if args.libraries:
        lines += libraries(args, work)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    write_peers(
        args.peers,
        "\n".join(
            [
                "## Retriever vs Search-R1's retrieval server design",
                "",
                what,
                "",
                table,
                "",
                "Details: `bench/results/retriever.md`.",
                "",
            ]
        ),
    )
    print(f"wrote {args.out} and {args.peers}")


if __name__ == "__main__":
    main()
