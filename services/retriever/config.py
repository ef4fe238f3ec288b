"""Retriever settings (``[retriever]`` in a recipe, ``CODA_RETRIEVER_*`` in the environment, ``--flags``)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from shared.protocol.retrieval import DEFAULT_TOPK
from shared.settings import ServiceSettings, service_config


class RetrieverSettings(ServiceSettings):
    """How ``python -m services.retriever serve`` loads its index and answers ``POST /retrieve``."""

    model_config = service_config("CODA_RETRIEVER_")
    toml_section: ClassVar[str] = "retriever"

    index_dir: str = Field("runs/index/hotpotqa", description="Index directory written by `build`")
    host: str = Field("0.0.0.0", description="Interface to bind (0.0.0.0, as Search-R1's server does)")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port")
    dense_backend: Literal["faiss", "chroma"] = Field("faiss", description="Dense index to serve from")

    default_topk: int = Field(DEFAULT_TOPK, ge=1, description="topk when a request sends null or 0")
    max_topk: int = Field(1000, ge=1, description="Largest topk a request may ask for (else 400)")
    max_queries: int = Field(10_000, ge=1, description="Most queries in one request (else 400)")
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="Largest request body (else 413)")

    mode: Literal["hybrid", "dense", "sparse"] = Field(
        "hybrid",
        description="Default retrieval mode. sparse: BM25 only, no encoder or dense index loaded (requests "
        "for dense or hybrid get 400)",
    )
    fusion: Literal["minmax", "rrf", "zscore"] = Field("minmax", description="Default hybrid fusion")
    sparse_weight: float = Field(0.5, ge=0, le=1, description="Default convex weight of BM25 (minmax/zscore)")
    depth: int = Field(100, ge=1, description="Default candidates per side before fusing (at least topk)")
    max_depth: int = Field(2000, ge=1, description="Largest fusion depth a request may ask for")
    rrf_k: float = Field(60.0, gt=0, description="Default RRF constant")

    encoder: str | None = Field(None, description="Query encoder; default: the one the index was built with")
    query_prefix: str | None = Field(None, description="Prefix for queries (e5: 'query: '); default: manifest")
    device: str = Field("auto", description="Encoder device: auto (cuda when present), cpu, cuda:0, …")
    encoder_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Query encoder precision on CPU (CUDA: float16). auto: bfloat16 where the CPU multiplies "
        "bf16 natively (AVX512-BF16/AMX; twice fp32's speed, cosine to fp32 >= 0.9999), else float32",
    )
    onnx_max_queries: int | None = Field(
        None,
        ge=0,
        description="Encoder passes of at most this many queries run on an fp32 ONNX Runtime copy (CPU; 0: "
        "never). Unset: every pass with a float32 encoder, passes of 1-2 queries with bfloat16 (measured fastest)",
    )
    encode_batch_size: int = Field(
        16,
        ge=1,
        description="Queries per encoder forward pass, grouped by length (16 measured fastest on CPU: less padding)",
    )
    cpu_threads: int = Field(
        0,
        ge=0,
        description="Search workers on CPU, each one thread for torch and FAISS "
        "(0: one per CPU this process may use: affinity, cgroup quota)",
    )
    faiss_search_params: str = Field("", description="FAISS parameters, e.g. 'efSearch=128' or 'nprobe=32'")
    faiss_gpu: bool = Field(True, description="Move the FAISS index to the GPUs when FAISS sees any")
    chroma_ef_search: int = Field(256, ge=1, description="Chroma HNSW ef at search time")
    bm25_mmap: bool = Field(True, description="Memory-map the BM25 index instead of loading it")

    batch_window_ms: float = Field(
        0.0,
        ge=0,
        description="How long an idle worker waits for a chunk to fill up "
        "(0: start at once; load fills chunks by itself)",
    )
    chunk_queries: int = Field(
        16,
        ge=1,
        description="Most queries in one unit of work; a request's queries are "
        "taken in turn with other requests', this many at a time",
    )
