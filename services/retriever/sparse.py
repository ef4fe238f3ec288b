"""The sparse side: a bm25s index with one tokenizer shared by indexing and querying.

The tokenizer settings (lowercase, stopwords, stemmer) are saved next to the index and reloaded with it:
FlashRAG tokenises its queries differently from its index, which silently costs recall; this cannot.
Results use the house convention: ``ids`` (int64, −1 = empty slot) and ``scores`` of shape ``(n, k)``.
A document that shares no term with the query (BM25 score 0) is not a hit and is left out.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

SPARSE_DIR = "bm25"
TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class Bm25Config:
    method: str = "lucene"
    k1: float = 1.5
    b: float = 0.75
    stopwords: str = "en"
    stemmer: str | None = "english"  # a PyStemmer language, or None for no stemming


def _bm25s():
    """bm25s, imported with JAX (if installed) kept on the CPU.

    bm25s imports JAX when it can and runs one top-k at import time; on a GPU host JAX then takes 75% of the
    GPU's memory (measured on an H200: 107 GB held by a sparse retriever that never uses it). Top-k here is
    numpy's (``backend_selection="numpy"``), so JAX gets the CPU: a user's own ``JAX_PLATFORMS`` still wins.
    """
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import bm25s

    return bm25s


def _stemmer(name: str | None):
    if not name:
        return None
    import Stemmer

    return Stemmer.Stemmer(name)


class SparseIndex:
    """BM25 over the corpus ``contents`` (bm25s, numpy backend, memory-mapped when loaded)."""

    def __init__(self, retriever, config: Bm25Config) -> None:
        self.retriever, self.config = retriever, config
        self._stem = _stemmer(config.stemmer)

    @property
    def num_docs(self) -> int:
        return int(self.retriever.scores["num_docs"])

    def tokenize(self, texts: list[str], show_progress: bool = False) -> list[list[str]]:
        return _bm25s().tokenize(
            texts, stopwords=self.config.stopwords, stemmer=self._stem, return_ids=False, show_progress=show_progress
        )

    @classmethod
    def build(cls, texts: list[str], config: Bm25Config = Bm25Config()) -> SparseIndex:
        index = cls(_bm25s().BM25(method=config.method, k1=config.k1, b=config.b), config)
        index.retriever.index(index.tokenize(texts, show_progress=True), show_progress=True)
        return index

    def save(self, index_dir: Path) -> None:
        path = index_dir / SPARSE_DIR
        self.retriever.save(str(path))
        (path / TOKENIZER_FILE).write_text(json.dumps(asdict(self.config), indent=2))

    @classmethod
    def load(cls, index_dir: Path, mmap: bool = True) -> SparseIndex:
        path = index_dir / SPARSE_DIR
        config = Bm25Config(**json.loads((path / TOKENIZER_FILE).read_text()))
        return cls(_bm25s().BM25.load(str(path), mmap=mmap), config)

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` per query by BM25 score, best first (ties: smaller document id first)."""
        n = len(queries)
        k = min(k, self.num_docs)
        ids = np.full((n, max(k, 0)), -1, np.int64)
        scores = np.full((n, max(k, 0)), -np.inf, np.float32)
        if n == 0 or k <= 0:
            return ids, scores
        if self.retriever.nonoccurrence_array is not None:  # BM25L/BM25+: every document scores above 0
            return self._search_bm25s(queries, k)
        vocab = self.retriever.vocab_dict
        for row, tokens in enumerate(self.tokenize(queries)):
            token_ids = [vocab[t] for t in tokens if t in vocab]
            if not token_ids:
                continue
            # bm25s's own top-k runs argpartition over every document's score, almost all of them 0; on
            # 200,000 documents that took ~40 ms a query (numpy's selection is slow on masses of ties),
            # against well under 1 ms for scoring. Only documents sharing a term can be hits: select there.
            doc_scores = self.retriever.get_scores_from_ids(token_ids)
            hits = np.flatnonzero(doc_scores > 0)
            if len(hits) > k:
                hits = hits[np.argpartition(-doc_scores[hits], k - 1)[:k]]
            hits = hits[np.lexsort((hits, -doc_scores[hits]))]
            ids[row, : len(hits)] = hits
            scores[row, : len(hits)] = doc_scores[hits]
        return ids, scores

    def _search_bm25s(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        docs, scores = self.retriever.retrieve(
            self.tokenize(queries), k=k, show_progress=False, backend_selection="numpy"
        )
        docs = np.asarray(docs, dtype=np.int64)
        scores = np.asarray(scores, dtype=np.float32)
        hit = scores > 0
        return np.where(hit, docs, -1), np.where(hit, scores, -np.inf).astype(np.float32)
