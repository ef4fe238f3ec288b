"""Retriever benchmark: writes ``bench/results/retriever.md``.

At the bundled corpus (6,785 HotpotQA passages) and at a synthetic corpus (default 200,000 passages whose
words are drawn from the bundled corpus's word frequencies; random unit vectors for the dense half):
1. bm25s vs rank-bm25 on the same tokenised documents and queries: per-query latency p50/p99, throughput;
2. dense vs sparse vs hybrid through the in-process engine: single-query p50/p99, batch throughput;
3. the HTTP server (its own process) under 64 concurrent clients with 1 and 512 queries per request:
   errors, p50/p99 per request, throughput, and the HTTP + fusion overhead relative to the raw index time
   (encode + dense search + BM25) the server itself recorded for the same requests.

Everything in one table is measured in the same run, so ratios compare like with like even on a busy host.

    python bench/retriever.py                   # full run (several minutes on 2 cores)
    python bench/retriever.py --docs 20000 --pool 256   # a quicker look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "data" / "hotpotqa"


def pct(values, q) -> float:
    return float(np.percentile(np.asarray(values) * 1000, q))


def lat_row(name: str, latencies: list[float], throughput: float, extra: str = "") -> str:
    return f"| {name} | {pct(latencies, 50):.2f} | {pct(latencies, 99):.2f} | {throughput:,.0f} | {extra} |"


# ---------------------------------------------------------------- corpora


def bundled() -> tuple[Path, Path, list[str]]:
    questions = [json.loads(line)["question"] for line in (DATA / "qa_supported.jsonl").read_text().splitlines()]
    return DATA / "corpus.jsonl", DATA / "corpus_emb_all-MiniLM-L6-v2_fp16.npy", questions


def synthetic(n_docs: int, out: Path, seed: int = 0) -> tuple[Path, Path, list[str]]:
    """Passages of 40–120 words drawn from the bundled corpus's unigram distribution; random unit vectors."""
    rng = np.random.default_rng(seed)
    words: dict[str, int] = {}
    for line in (DATA / "corpus.jsonl").read_text().splitlines():
        for w in re.findall(r"\w+", json.loads(line)["contents"]):
            words[w] = words.get(w, 0) + 1
    vocab = np.array(list(words))
    p = np.array(list(words.values()), np.float64)
    p /= p.sum()
    lengths = rng.integers(40, 121, n_docs)
    tokens = rng.choice(len(vocab), size=int(lengths.sum()), p=p)
    corpus = out / "synthetic.jsonl"
    with open(corpus, "w") as f:
        start = 0
        for i, n in enumerate(lengths):
            text = " ".join(vocab[tokens[start:start + n]])
            start += n
            f.write(json.dumps({"id": str(i), "contents": f'"Synthetic {i}"\n{text}'}) + "\n")
    emb = rng.standard_normal((n_docs, 384)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    np.save(out / "synthetic_emb.npy", emb.astype(np.float16))
    # Queries: 4–10 words, weighted towards rarer words so they discriminate like real questions do.
    q_p = np.sqrt(p) / np.sqrt(p).sum()
    queries = [" ".join(vocab[rng.choice(len(vocab), size=rng.integers(4, 11), p=q_p)]) for _ in range(4096)]
    return corpus, out / "synthetic_emb.npy", queries


def distinct(queries: list[str], n: int) -> list[str]:
    """n distinct queries: the originals, then numbered variants (so deduplication never helps a batch)."""
    out = list(dict.fromkeys(queries))
    base = list(out)
    while len(out) < n:
        out += [f"{q} {len(out) + i}" for i, q in enumerate(base[: n - len(out)])]
    return out[:n]


def build(corpus: Path, emb: Path, out: Path) -> float:
    from services.retriever.build import BuildOptions, build_index

    start = time.perf_counter()
    build_index(BuildOptions(corpus=corpus, out=out, embeddings=emb))
    return time.perf_counter() - start


# ---------------------------------------------------------------- 1. bm25s vs rank-bm25


def sparse_libraries(index_dir: Path, corpus: Path, queries: list[str], n_rank: int) -> list[str]:
    from rank_bm25 import BM25Okapi

    from services.retriever.sparse import SparseIndex

    sparse = SparseIndex.load(index_dir, mmap=False)
    texts = [json.loads(line)["contents"] for line in (index_dir / "corpus.jsonl").read_text().splitlines()]
    doc_tokens = sparse.tokenize(texts)
    query_tokens = [t for t in sparse.tokenize(queries[:n_rank]) if t]
    start = time.perf_counter()
    okapi = BM25Okapi(doc_tokens, k1=1.5, b=0.75)
    okapi_build = time.perf_counter() - start

    def rank_one(tokens):
        scores = okapi.get_scores(tokens)
        return np.argpartition(-scores, 10)[:10]

    def bm25s_one(tokens):
        return sparse.retriever.retrieve([tokens], k=10, show_progress=False)

    # Interleaved (each query on both libraries in turn), so load from other processes hits both alike.
    per: dict[str, list[float]] = {"bm25s": [], "rank-bm25": []}
    for tokens in query_tokens:
        for name, fn in (("bm25s", bm25s_one), ("rank-bm25", rank_one)):
            t = time.perf_counter()
            fn(tokens)
            per[name].append(time.perf_counter() - t)
    rows = [lat_row(name, lat, len(lat) / sum(lat), f"{len(lat)} queries, one at a time")
            for name, lat in per.items()]
    t = time.perf_counter()
    sparse.retriever.retrieve(sparse.tokenize(queries), k=10, show_progress=False)
    batch = len(queries) / (time.perf_counter() - t)
    ratio = np.median(per["rank-bm25"]) / np.median(per["bm25s"])
    rows.append(f"| bm25s, one batch of {len(queries)} (tokenising included) | | | {batch:,.0f} | |")
    rows.append(f"| **rank-bm25 / bm25s (median latency)** | | | | **{ratio:,.0f}×** (rank-bm25 index build "
                f"{okapi_build:.1f} s) |")
    return rows


# ---------------------------------------------------------------- 2. dense vs sparse vs hybrid


def modes(index_dir: Path, queries: list[str], threads: int) -> list[str]:
    from services.retriever.config import RetrieverSettings
    from services.retriever.engine import load_retriever

    retriever = load_retriever(RetrieverSettings.load(index_dir=str(index_dir), cpu_threads=threads))
    retriever.search(queries[:8], 3, "hybrid")  # warm up
    batch, singles = queries[:512], queries[512:576]
    latencies: dict[str, list[float]] = {mode: [] for mode in ("dense", "sparse", "hybrid")}
    for q in singles:  # interleaved: each query in every mode in turn
        for mode, lat in latencies.items():
            t = time.perf_counter()
            retriever.search([q], 3, mode)
            lat.append(time.perf_counter() - t)
    rows = []
    for mode, lat in latencies.items():
        t = time.perf_counter()
        retriever.search(batch, 3, mode)
        throughput = len(batch) / (time.perf_counter() - t)
        rows.append(lat_row(mode, lat, throughput, f"p50/p99: {len(lat)} single queries; q/s: one batch of 512"))
    retriever.close()
    return rows


# ---------------------------------------------------------------- 3. HTTP under 64 concurrent clients


def scrape(url: str) -> dict[str, float]:
    import httpx

    text = httpx.get(url + "/metrics", timeout=30).text
    out = {}
    for name, value in re.findall(r'^(coda_retriever_stage_seconds_sum\{stage="\w+"\}|'
                                  r"coda_retriever_batch_requests_(?:count|sum)) (\S+)$", text, re.MULTILINE):
        out[name] = float(value)
    return out


async def http_load(url: str, queries: list[str], clients: int, per_request: int, requests_each: int):
    import httpx

    rng = np.random.default_rng(1)
    latencies, errors = [], 0

    async def client(session):
        nonlocal errors
        for _ in range(requests_each):
            body = {"queries": [queries[i] for i in rng.integers(0, len(queries), per_request)], "topk": 3,
                    "return_scores": True}
            t = time.perf_counter()
            try:
                r = await session.post(url + "/retrieve", json=body)
                ok = r.status_code == 200 and len(r.json()["result"]) == per_request
            except httpx.HTTPError:
                ok = False
            latencies.append(time.perf_counter() - t)
            errors += not ok

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=600, limits=limits) as session:
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        wall = time.perf_counter() - start
    return latencies, errors, wall


def http(index_dir: Path, queries: list[str], clients: int, pool: int, threads: int) -> list[str]:
    from shared.redis_server import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "CODA_LOG_LEVEL": "WARNING"}
    server = subprocess.Popen([sys.executable, "-m", "services.retriever", "serve", "--index", str(index_dir),
                               "--host", "127.0.0.1", "--port", str(port), "--cpu-threads", str(threads)],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(url, server)
        rows = []
        for per_request, each in ((1, 8), (512, 1)):
            before = scrape(url)
            lat, errors, wall = asyncio.run(http_load(url, queries[:pool], clients, per_request, each))
            after = scrape(url)
            diff = {k: after[k] - before.get(k, 0.0) for k in after}
            stage = {s: diff.get(f'coda_retriever_stage_seconds_sum{{stage="{s}"}}', 0.0)
                     for s in ("encode", "dense", "sparse")}
            raw = sum(stage.values())
            fuse = diff.get('coda_retriever_stage_seconds_sum{stage="fuse"}', 0.0)
            batches = diff["coda_retriever_batch_requests_count"]
            overhead = (wall - raw) / raw if raw else float("nan")
            stages = ", ".join(f"{name} {seconds:.1f}" for name, seconds in stage.items())
            rows.append(lat_row(f"{clients} clients × {each} req × {per_request} q", lat,
                                len(lat) * per_request / wall,
                                f"errors {errors}/{len(lat)}; {batches:.0f} batches; raw index {raw:.2f} s "
                                f"({stages}), fusion {fuse:.2f} s, wall {wall:.2f} s → "
                                f"**HTTP + fusion overhead {overhead:+.0%}**"))
        return rows
    finally:
        server.terminate()
        server.wait(timeout=30)


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


# ---------------------------------------------------------------- main


def section(title: str, header: str, rows: list[str]) -> str:
    return "\n".join([f"#### {title}", "", header, "|---|---|---|---|---|", *rows, ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=200_000, help="synthetic corpus size")
    parser.add_argument("--clients", type=int, default=64, help="concurrent HTTP clients")
    parser.add_argument("--pool", type=int, default=512, help="distinct queries the HTTP clients draw from")
    parser.add_argument("--rank-queries", type=int, default=20, help="queries timed on rank-bm25 (it is slow)")
    parser.add_argument("--threads", type=int, default=1, help="server cpu_threads (torch and FAISS)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "retriever.md")
    args = parser.parse_args()
    os.environ.setdefault("CODA_LOG_LEVEL", "WARNING")
    from shared.log import configure_logging

    configure_logging()
    work = Path(tempfile.mkdtemp(prefix="retriever-bench-"))
    lines = ["# Retriever benchmark", "", f"Written by `bench/retriever.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
             f"host: {os.cpu_count()} CPU cores, load average at start {os.getloadavg()[0]:.1f} (shared machine: "
             "absolute times are noisy, ratios within one table were measured side by side). Encoder "
             f"all-MiniLM-L6-v2 on CPU, cpu_threads={args.threads}, FAISS Flat, bm25s numpy backend, topk 3, "
             "hybrid = min-max fusion over the top-100 of each side.", ""]
    corpora = [("bundled HotpotQA, 6,785 docs", *bundled()),
               (f"synthetic, {args.docs:,} docs", *synthetic(args.docs, work))]
    for name, corpus, emb, queries in corpora:
        print(f"== {name}", flush=True)
        index_dir = work / re.sub(r"\W+", "-", name)
        build_s = build(corpus, emb, index_dir)
        queries = distinct(queries, 4096)
        lines += [f"### {name} (index build {build_s:.1f} s from precomputed vectors)", ""]
        lines.append(section("bm25s vs rank-bm25 (same tokens, top-10)", "| library | p50 ms | p99 ms | q/s | |",
                             sparse_libraries(index_dir, corpus, queries, args.rank_queries)))
        print("\n".join(lines[-8:]), flush=True)
        lines.append(section("dense vs sparse vs hybrid (in-process engine, encode included)",
                             "| mode | p50 ms | p99 ms | q/s | |", modes(index_dir, queries, args.threads)))
        print(lines[-1], flush=True)
        lines.append(section(f"HTTP server, {args.clients} concurrent clients ({args.pool} distinct queries)",
                             "| load | p50 ms/request | p99 ms/request | q/s | |",
                             http(index_dir, queries, args.clients, args.pool, args.threads)))
        print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
