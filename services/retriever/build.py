"""``build``: corpus JSONL → an index directory (canonical corpus, BM25, FAISS, optional Chroma, manifest).

index_dir/
  manifest.json        encoder, dims, counts, factory, tokenizer, library versions, timings
  corpus.jsonl         canonical rows (id, contents, extras), one compact JSON object per line
  corpus_offsets.npy   byte offset of every row, so rows are read by position without parsing
  bm25/                bm25s index + the tokenizer settings it was built with
  dense.faiss          FAISS index (inner product over unit vectors)
  chroma/              optional ChromaDB collection of the same vectors
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from services.retriever.corpus import read_jsonl, write_corpus
from services.retriever.engine import MANIFEST_FILE
from services.retriever.sparse import Bm25Config
from shared.log import get_logger

log = get_logger(__name__)


@dataclass
class BuildOptions:
    corpus: Path
    out: Path
    encoder: str = "all-MiniLM-L6-v2"
    embeddings: Path | None = None  # precomputed passage vectors (.npy), row i = corpus row i
    faiss_factory: str = "Flat"
    chroma: bool = False
    query_prefix: str = ""
    passage_prefix: str = ""
    device: str = "auto"
    batch_size: int = 256
    bm25: Bm25Config = field(default_factory=Bm25Config)


def _versions() -> dict[str, str]:
    out = {}
    for package in ("faiss-cpu", "faiss-gpu", "bm25s", "sentence-transformers", "chromadb", "numpy"):
        with contextlib.suppress(PackageNotFoundError):
            out[package] = version(package)
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_contents(options: BuildOptions) -> list[str]:
    from tqdm import tqdm

    rows = tqdm(read_jsonl(options.corpus), desc="corpus", unit=" rows")
    return list(write_corpus(rows, options.out))


def _passage_vectors(options: BuildOptions, contents: list[str]):
    import numpy as np

    from services.retriever.encoder import Encoder, load_embeddings

    given = None
    if options.embeddings is not None:
        # Vectors of the first rows may be given for a corpus that grew (the bundled HotpotQA dev corpus begins
        # with the 6,785 rows whose vectors ship): only the rows after them are encoded.
        given = load_embeddings(options.embeddings, len(contents), prefix=True)
        if len(given) == len(contents):
            return given, {"name": options.encoder, "dim": int(given.shape[1]), "embeddings": str(options.embeddings)}
    encoder = Encoder(
        options.encoder, passage_prefix=options.passage_prefix, device=options.device, batch_size=options.batch_size
    )
    if given is None:
        return encoder.encode_passages(contents), {"name": options.encoder, "dim": encoder.dim}
    rest = encoder.encode_passages(contents[len(given) :])
    meta = {"name": options.encoder, "dim": encoder.dim, "embeddings": str(options.embeddings), "given": len(given)}
    return np.concatenate([given, rest.astype(np.float32)]), meta


def build_index(options: BuildOptions) -> dict:
    """Build every part of the index directory; returns the manifest it wrote."""
    from services.retriever.dense import FaissIndex
    from services.retriever.sparse import SparseIndex

    options.out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    contents = _read_contents(options)
    if not contents:
        raise ValueError(f"{options.corpus} holds no rows")
    timings["corpus_s"] = time.perf_counter() - start

    start = time.perf_counter()
    SparseIndex.build(contents, options.bm25).save(options.out)
    timings["bm25_s"] = time.perf_counter() - start

    start = time.perf_counter()
    vectors, encoder = _passage_vectors(options, contents)
    timings["embed_s"] = time.perf_counter() - start

    start = time.perf_counter()
    FaissIndex.build(vectors, options.faiss_factory).save(options.out)
    timings["faiss_s"] = time.perf_counter() - start
    backends = ["faiss"]
    if options.chroma:
        from services.retriever.chroma import ChromaIndex

        start = time.perf_counter()
        ChromaIndex.build(options.out, vectors)
        timings["chroma_s"] = time.perf_counter() - start
        backends.append("chroma")

    manifest = {
        "format": 1,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "corpus": {"source": str(options.corpus), "sha256": _sha256(options.corpus), "rows": len(contents)},
        "encoder": {**encoder, "query_prefix": options.query_prefix, "passage_prefix": options.passage_prefix},
        "faiss_factory": options.faiss_factory,
        "dense_backends": backends,
        "bm25": asdict(options.bm25),
        "versions": _versions(),
        "timings": {k: round(v, 3) for k, v in timings.items()},
    }
    (options.out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
    log.info("index built", extra={"out": str(options.out), "rows": len(contents), **manifest["timings"]})
    return manifest
