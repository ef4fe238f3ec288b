"""The dense side on FAISS: an inner-product index from a factory string (``Flat``, ``HNSW32``, ``IVF…,PQ…``).

Vectors are unit-norm, so inner product is cosine. FAISS pads with id −1 when it has fewer than k results
(k beyond the corpus, HNSW/IVF misses); those slots stay −1 here and are dropped before anything reads a
corpus row (Search-R1 looks up ``corpus[-1]`` and serves the last row). GPU: when a CUDA build of FAISS
sees GPUs the index is copied to them in fp16, sharded, as Search-R1 does; such an index is not
thread-safe, which is fine because one thread owns it (see ``batching``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shared.log import get_logger

log = get_logger(__name__)

FAISS_FILE = "dense.faiss"
# Flat search of this many queries or more goes through BLAS, fewer through FAISS's own SIMD loop. Measured on
# the bundled index (6,785 × 384, one thread): 1 query 0.2 ms SIMD vs 1.0 ms BLAS, 8: 1.2 vs 1.4, 12: 2.1 vs 1.6,
# 64: BLAS 10× faster (env-notes §3). FAISS 1.15 compares queries × dimension with its threshold (its default,
# 128000, keeps 300+ queries of 384-d on the slow loop); older releases compared queries alone.
BLAS_MIN_QUERIES = 10


def configure_faiss(dim: int) -> None:
    import faiss

    per_dimension = faiss.cvar.distance_compute_blas_threshold > 1000  # the 1.15-style default
    faiss.cvar.distance_compute_blas_threshold = BLAS_MIN_QUERIES * dim - 1 if per_dimension else BLAS_MIN_QUERIES - 1


def _train_sample(vectors: np.ndarray, limit: int = 262_144, seed: int = 0) -> np.ndarray:
    if len(vectors) <= limit:
        return vectors
    rows = np.random.default_rng(seed).choice(len(vectors), size=limit, replace=False)
    return vectors[np.sort(rows)]


class FaissIndex:
    """``search(vectors, k) -> (ids, scores)`` over unit vectors; ids −1 for empty slots."""

    def __init__(self, index, search_params: str = "") -> None:
        import faiss

        configure_faiss(index.d)
        self.index = index
        if search_params:  # e.g. "efSearch=128" (HNSW) or "nprobe=32" (IVF)
            faiss.ParameterSpace().set_index_parameters(self.index, search_params)
        self.on_gpu = False

    @property
    def num_docs(self) -> int:
        return int(self.index.ntotal)

    @classmethod
    def build(cls, vectors: np.ndarray, factory: str = "Flat", search_params: str = "") -> FaissIndex:
        import faiss

        index = faiss.index_factory(vectors.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            log.info("training the FAISS index", extra={"factory": factory})
            index.train(_train_sample(vectors))
        for start in range(0, len(vectors), 65_536):
            index.add(vectors[start : start + 65_536])
        return cls(index, search_params)

    def save(self, index_dir: Path) -> None:
        import faiss

        faiss.write_index(self.index, str(index_dir / FAISS_FILE))

    @classmethod
    def load(cls, index_dir: Path, search_params: str = "", use_gpu: bool = True) -> FaissIndex:
        import faiss

        out = cls(faiss.read_index(str(index_dir / FAISS_FILE)), search_params)
        if use_gpu and hasattr(faiss, "index_cpu_to_all_gpus") and faiss.get_num_gpus() > 0:
            options = faiss.GpuMultipleClonerOptions()
            options.useFloat16, options.shard = True, True
            out.index, out.on_gpu = faiss.index_cpu_to_all_gpus(out.index, co=options), True
            log.info("FAISS index on GPU", extra={"gpus": faiss.get_num_gpus()})
        return out

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(vectors)
        k = min(k, self.num_docs)
        if n == 0 or k <= 0:
            return np.full((n, max(k, 0)), -1, np.int64), np.full((n, max(k, 0)), -np.inf, np.float32)
        scores, ids = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)
        ids = ids.astype(np.int64)
        return ids, np.where(ids >= 0, scores, -np.inf).astype(np.float32)
