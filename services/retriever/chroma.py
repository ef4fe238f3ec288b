"""The alternative dense backend: a persistent ChromaDB collection holding our own embeddings.

Chroma never embeds anything here (``embedding_function=None``; we pass vectors in and out), so it cannot
try to download its default model. Its index is HNSW with inner-product space; ``ef_search`` is set
explicitly because small defaults (10 in old releases) silently lose recall. Chroma stores only ids and
vectors: documents are served from the corpus store like with FAISS. Same ``search`` contract as
``FaissIndex``: ``(ids, scores)``, ids −1 for empty slots, scores = inner product (cosine).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shared.log import get_logger

log = get_logger(__name__)

CHROMA_DIR = "chroma"
COLLECTION = "corpus"


def _client(index_dir: Path):
    import chromadb
    from chromadb.config import Settings

    return chromadb.PersistentClient(
        path=str(index_dir / CHROMA_DIR), settings=Settings(anonymized_telemetry=False, allow_reset=False)
    )


class ChromaIndex:
    """Dense search over a Chroma collection whose ids are corpus row positions."""

    def __init__(self, collection, ef_search: int) -> None:
        self.collection = collection
        self.ef_search = ef_search
        self._count = collection.count()

    @property
    def num_docs(self) -> int:
        return self._count

    @classmethod
    def build(
        cls,
        index_dir: Path,
        vectors: np.ndarray,
        *,
        ef_construction: int = 200,
        ef_search: int = 256,
        max_neighbors: int = 32,
    ) -> ChromaIndex:
        client = _client(index_dir)
        hnsw = {
            "space": "ip",
            "ef_construction": ef_construction,
            "ef_search": ef_search,
            "max_neighbors": max_neighbors,
        }
        collection = client.get_or_create_collection(COLLECTION, embedding_function=None, configuration={"hnsw": hnsw})
        step = max(1, min(client.get_max_batch_size(), 5_000))
        for start in range(0, len(vectors), step):
            chunk = vectors[start : start + step]
            collection.add(ids=[str(i) for i in range(start, start + len(chunk))], embeddings=chunk)
        log.info("chroma collection built", extra={"docs": collection.count(), **hnsw})
        return cls(collection, ef_search)

    @classmethod
    def load(cls, index_dir: Path, ef_search: int = 256) -> ChromaIndex:
        collection = _client(index_dir).get_collection(COLLECTION, embedding_function=None)
        # ef_search may be changed after creation; make the served value the configured one.
        collection.modify(configuration={"hnsw": {"ef_search": ef_search}})
        return cls(collection, ef_search)

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(vectors)
        k = min(k, self.num_docs)
        ids = np.full((n, max(k, 0)), -1, np.int64)
        scores = np.full((n, max(k, 0)), -np.inf, np.float32)
        if n == 0 or k <= 0:
            return ids, scores
        found = self.collection.query(
            query_embeddings=np.asarray(vectors, np.float32), n_results=k, include=["distances"]
        )
        for row, (row_ids, row_dist) in enumerate(zip(found["ids"], found["distances"], strict=True)):
            m = len(row_ids)
            ids[row, :m] = np.asarray(row_ids, dtype=np.int64)
            scores[row, :m] = 1.0 - np.asarray(row_dist, dtype=np.float32)  # hnswlib "ip" distance = 1 − dot
        return ids, scores
