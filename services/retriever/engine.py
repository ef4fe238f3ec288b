"""The retriever proper: corpus + encoder + dense index + BM25, answering many searches in one pass.

``search_many`` takes the searches of several requests at once (the micro-batcher hands it everything that
queued up), removes duplicate queries (GRPO's n rollouts of one prompt often ask the same thing), encodes
once, searches each side once at the largest depth any request needs, then cuts and fuses per request.
On CPU several worker threads call it at once, each single-threaded inside torch and FAISS (see
``batching``); on a GPU one thread does. A server started with ``mode = "sparse"`` is sparse-only: it loads
neither the encoder nor the dense index (``load_retriever``) and refuses dense and hybrid searches.
"""

from __future__ import annotations

import functools
import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.retriever.corpus import CorpusStore
from services.retriever.fusion import fuse
from shared.log import get_logger

log = get_logger(__name__)

MANIFEST_FILE = "manifest.json"
Result = tuple[np.ndarray, np.ndarray]  # (ids, scores), shape (n_queries, k), ids −1 = empty slot
SideSearch = Callable[[list[str], int], Result]


class SparseOnlyError(ValueError):
    """A dense or hybrid search asked of a retriever that loaded no encoder (``mode = "sparse"``)."""

    def __init__(self, mode: str) -> None:
        super().__init__(
            f'this retriever was started sparse-only ([retriever] mode = "sparse"): it loaded no encoder and no '
            f"dense index, so it cannot answer mode={mode}; send mode=sparse (or no mode), or restart it with "
            f'mode = "hybrid" or "dense"'
        )


@dataclass(frozen=True)
class SearchSpec:
    """One request's search: its queries and the resolved options (no None left)."""

    queries: list[str]
    k: int
    mode: str = "hybrid"
    fusion: str = "minmax"
    sparse_weight: float = 0.5
    depth: int = 100
    rrf_k: float = 60.0

    def side_k(self) -> int:
        """Candidates this search needs from each side: k alone, or the fusion depth (at least k)."""
        return max(self.depth, self.k) if self.mode == "hybrid" else self.k


def read_manifest(index_dir: str | Path) -> dict:
    path = Path(index_dir) / MANIFEST_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{index_dir} is not an index directory (no {MANIFEST_FILE}); "
            f"build one with `python -m services.retriever build`"
        )
    return json.loads(path.read_text())


def _dedupe(queries: list[str]) -> tuple[list[str], np.ndarray]:
    position: dict[str, int] = {}
    inverse = np.fromiter((position.setdefault(q, len(position)) for q in queries), np.int64, len(queries))
    return list(position), inverse


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup CPU quota (containers)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:  # cgroup v2: "max 100000" (no quota) or "200000 100000" (2 CPUs)
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


class Retriever:
    """Owns the indexes; ``search_many(specs)`` → one ``(ids, scores)`` per spec.

    ``dense`` and ``encoder`` are None in a sparse-only retriever (see ``load_retriever``).
    """

    def __init__(
        self,
        corpus: CorpusStore,
        sparse,
        dense,
        encoder,
        observe: Callable[[str, float], None] | None = None,
        cpu_threads: int = 0,
    ) -> None:
        self.corpus, self.sparse, self.dense, self.encoder = corpus, sparse, dense, encoder
        self.observe = observe or (lambda stage, seconds: None)
        # Search workers: one per CPU given; one in all on a GPU (FAISS GPU indexes are not thread-safe).
        on_gpu = getattr(dense, "on_gpu", False) or str(getattr(encoder, "device", "cpu")).startswith("cuda")
        self.workers = 1 if on_gpu else (cpu_threads or available_cpus())
        self._local = threading.local()

    def prepare_thread(self) -> None:
        """Make the calling thread single-threaded in FAISS (OpenMP's thread count is per calling thread).

        Parallelism comes from several workers on separate chunks: OpenMP workers spin while they wait,
        and on a CPU shared with other busy processes two spinning threads made one small query 10–20×
        slower than one thread did.
        """
        if getattr(self._local, "limited", False) or self.dense is None:  # sparse-only: FAISS never runs
            return
        import faiss

        faiss.omp_set_num_threads(1)
        self._local.limited = True

    @property
    def sparse_only(self) -> bool:
        return self.encoder is None

    @property
    def num_docs(self) -> int:
        return len(self.corpus)

    def _timed(self, stage: str, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        self.observe(stage, time.perf_counter() - start)
        return out

    def _dense(self, queries: list[str], k: int, wide: bool = False) -> Result:
        vectors = self._timed("encode", self.encoder.encode_queries, queries, wide)
        return self._timed("dense", self.dense.search, vectors, k)

    def _sparse(self, queries: list[str], k: int) -> Result:
        return self._timed("sparse", self.sparse.search, queries, k)

    def _side(self, specs: list[SearchSpec], search: SideSearch) -> list[Result | None]:
        """Run one side for every spec that needs it, in one call; None for specs that do not."""
        if not specs:
            return []
        wanted = [s for s in specs if s is not None]
        if not wanted:
            return [None] * len(specs)
        unique, inverse = _dedupe([q for s in wanted for q in s.queries])
        ids, scores = search(unique, max(s.side_k() for s in wanted))
        ids, scores = ids[inverse], scores[inverse]
        out: list[Result | None] = []
        start = 0
        for spec in specs:
            if spec is None:
                out.append(None)
                continue
            n, k = len(spec.queries), spec.side_k()
            out.append((ids[start : start + n, :k], scores[start : start + n, :k]))
            start += n
        return out

    def search_many(self, specs: list[SearchSpec], wide: bool = False) -> list[Result]:
        """``wide``: no other chunk is running, so the encoder may use every worker's core (see batching)."""
        if self.sparse_only:
            refused = next((s.mode for s in specs if s.mode != "sparse"), None)
            if refused is not None:
                raise SparseOnlyError(refused)
        self.prepare_thread()
        dense = self._side(
            [s if s.mode != "sparse" else None for s in specs], functools.partial(self._dense, wide=wide)
        )
        sparse = self._side([s if s.mode != "dense" else None for s in specs], self._sparse)
        start = time.perf_counter()
        results = []
        for spec, d, s in zip(specs, dense, sparse, strict=True):
            if spec.mode == "dense":
                results.append(d)
            elif spec.mode == "sparse":
                results.append(s)
            else:
                results.append(fuse(d[0], d[1], s[0], s[1], spec.k, spec.fusion, spec.sparse_weight, spec.rrf_k))
        self.observe("fuse", time.perf_counter() - start)
        return results

    def search(self, queries: list[str], k: int, mode: str = "hybrid", **options) -> Result:
        """One search, for CLIs and evaluation (the server goes through the batcher)."""
        return self.search_many([SearchSpec(list(queries), k, mode, **options)])[0]

    def close(self) -> None:
        self.corpus.close()


def load_retriever(settings, observe: Callable[[str, float], None] | None = None) -> Retriever:
    """Load what the settings' mode needs from an index directory, with the settings' overrides.

    ``mode = "sparse"`` loads the corpus and BM25 only. A request may ask for another mode than the server's
    default, so serving dense on such a server would mean loading the model on its first dense request; that
    stalled every query for the ~8 s the load takes on CPU (one index owner), so a sparse-only server refuses
    those requests instead (``SparseOnlyError``, a 400 at the route). Any other mode loads and warms the encoder
    here, once, before the app reports ready.
    """
    from services.retriever.sparse import SparseIndex

    index_dir = Path(settings.index_dir)
    manifest = read_manifest(index_dir)
    started = time.perf_counter()
    corpus = CorpusStore(index_dir)
    sparse = SparseIndex.load(index_dir, mmap=settings.bm25_mmap)
    dense = encoder = None
    if settings.mode != "sparse":
        dense = _load_dense(settings, index_dir, manifest)
        encoder = _load_encoder(settings, manifest)
    log.info(
        "index loaded",
        extra={
            "index_dir": str(index_dir),
            "docs": len(corpus),
            "dense": settings.dense_backend if dense is not None else "off (sparse-only)",
            "seconds": round(time.perf_counter() - started, 2),
        },
    )
    return Retriever(corpus, sparse, dense, encoder, observe, cpu_threads=settings.cpu_threads)


def _load_dense(settings, index_dir: Path, manifest: dict):
    if settings.dense_backend == "chroma":
        from services.retriever.chroma import ChromaIndex

        if "chroma" not in manifest.get("dense_backends", []):
            raise ValueError(f"{index_dir} has no chroma collection; rebuild with `build --chroma`")
        return ChromaIndex.load(index_dir, ef_search=settings.chroma_ef_search)
    from services.retriever.dense import FaissIndex

    return FaissIndex.load(index_dir, settings.faiss_search_params, use_gpu=settings.faiss_gpu)


def _load_encoder(settings, manifest: dict):
    """The query encoder, checked against the index's dimension and warmed (the first request does not pay)."""
    from services.retriever.encoder import Encoder

    encoder = Encoder(
        settings.encoder or manifest["encoder"]["name"],
        query_prefix=(
            settings.query_prefix if settings.query_prefix is not None else manifest["encoder"].get("query_prefix", "")
        ),
        device=settings.device,
        batch_size=settings.encode_batch_size,
        threads=1,
        dtype=settings.encoder_dtype,
        onnx_max_queries=settings.onnx_max_queries,
        wide_threads=settings.cpu_threads or available_cpus(),
    )  # per worker thread; the workers are the parallelism (see Retriever)
    if encoder.dim != manifest["encoder"]["dim"]:
        raise ValueError(
            f"encoder {encoder.name} gives {encoder.dim}-d vectors; the index holds {manifest['encoder']['dim']}-d"
        )
    log.info("encoder warm", extra={"encoder": encoder.name, "seconds": round(encoder.warm(), 3)})
    return encoder
