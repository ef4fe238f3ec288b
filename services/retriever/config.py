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

    mode: Literal["hybrid", "dense", "sparse"] = Field("hybrid", description="Default retrieval mode")
    fusion: Literal["minmax", "rrf", "zscore"] = Field("minmax", description="Default hybrid fusion")
    sparse_weight: float = Field(0.5, ge=0, le=1, description="Default convex weight of BM25 (minmax/zscore)")
    depth: int = Field(100, ge=1, description="Default candidates per side before fusing (at least topk)")
    max_depth: int = Field(2000, ge=1, description="Largest fusion depth a request may ask for")
    rrf_k: float = Field(60.0, gt=0, description="Default RRF constant")

    encoder: str | None = Field(None, description="Query encoder; default: the one the index was built with")
    query_prefix: str | None = Field(None, description="Prefix for queries (e5: 'query: '); default: manifest")
    device: str = Field("auto", description="Encoder device: auto (cuda when present), cpu, cuda:0, …")
    encode_batch_size: int = Field(256, ge=1, description="Encoder batch size")
    cpu_threads: int = Field(0, ge=0, description="Threads for torch and FAISS on CPU (0: library default, "
                                                   "all cores; 1 is far faster on a shared, busy CPU)")
    faiss_search_params: str = Field("", description="FAISS parameters, e.g. 'efSearch=128' or 'nprobe=32'")
    faiss_gpu: bool = Field(True, description="Move the FAISS index to the GPUs when FAISS sees any")
    chroma_ef_search: int = Field(256, ge=1, description="Chroma HNSW ef at search time")
    bm25_mmap: bool = Field(True, description="Memory-map the BM25 index instead of loading it")

    batch_window_ms: float = Field(2.0, ge=0, description="How long a batch waits for more requests")
    max_batch_queries: int = Field(4096, ge=1, description="Stop adding requests to a batch past this many")
