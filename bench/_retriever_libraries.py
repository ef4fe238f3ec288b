"""The retriever bench's older sections (``python -m bench.retriever --libraries``): bm25s vs rank-bm25 on the same
tokens, and dense vs sparse vs hybrid in-process, on the bundled HotpotQA corpus and a synthetic one."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np

from bench._retriever_corpus import build, bundled, distinct, lat_row, section, synthetic

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
    rows = [lat_row(name, lat, len(lat) / sum(lat), f"{len(lat)} queries, one at a time") for name, lat in per.items()]
    t = time.perf_counter()
    sparse.retriever.retrieve(sparse.tokenize(queries), k=10, show_progress=False)
    batch = len(queries) / (time.perf_counter() - t)
    ratio = np.median(per["rank-bm25"]) / np.median(per["bm25s"])
    rows.append(f"| bm25s, one batch of {len(queries)} (tokenising included) | | | {batch:,.0f} | |")
    rows.append(
        f"| **rank-bm25 / bm25s (median latency)** | | | | **{ratio:,.0f}×** (rank-bm25 index build "
        f"{okapi_build:.1f} s) |"
    )
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


def libraries(args, work: Path) -> list[str]:
    lines = []
    corpora = [
        ("bundled HotpotQA, 6,785 docs", *bundled()),
        (f"synthetic, {args.docs:,} docs", *synthetic(args.docs, work)),
    ]
    for name, corpus, emb, queries in corpora:
        print(f"== {name}", flush=True)
        index_dir = work / re.sub(r"\W+", "-", name)
        build_s = build(corpus, emb, index_dir)
        queries = distinct(queries, 4096)
        lines += [f"### {name} (index build {build_s:.1f} s from precomputed vectors)", ""]
        lines.append(
            section(
                "bm25s vs rank-bm25 (same tokens, top-10)",
                "| library | p50 ms | p99 ms | q/s | |",
                sparse_libraries(index_dir, corpus, queries, args.rank_queries),
            )
        )
        lines.append(
            section(
                "dense vs sparse vs hybrid (in-process engine, encode included)",
                "| mode | p50 ms | p99 ms | q/s | |",
                modes(index_dir, queries, args.threads),
            )
        )
    return lines
