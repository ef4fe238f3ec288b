"""The retriever bench's corpora and table helpers, shared by ``bench.retriever`` and its ``--libraries``
sections (``bench._retriever_libraries``)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "hotpotqa"


def pct(values, q) -> float:
    return float(np.percentile(np.asarray(values) * 1000, q))


def lat_row(name: str, latencies: list[float], throughput: float, extra: str = "") -> str:
    return f"| {name} | {pct(latencies, 50):.2f} | {pct(latencies, 99):.2f} | {throughput:,.0f} | {extra} |"


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
            text = " ".join(vocab[tokens[start : start + n]])
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


def section(title: str, header: str, rows: list[str]) -> str:
    return "\n".join([f"#### {title}", "", header, "|---|---|---|---|---|", *rows, ""])
