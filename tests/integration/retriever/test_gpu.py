"""On a CUDA host the encoder runs on the GPU in fp16 (and FAISS moves to the GPU when its build has CUDA), and
recall on the bundled set stays what the fp32 CPU encoder measures (the reference table in test_recall.py)."""

from __future__ import annotations

import pytest

from services.retriever.build import BuildOptions, build_index
from services.retriever.config import RetrieverSettings
from services.retriever.engine import load_retriever
from services.retriever.evaluate import evaluate, load_qa
from tests.integration.retriever.conftest import CORPUS, EMBEDDINGS, QA

# fp32 CPU reference (test_recall.py): BM25 .824, MiniLM .777, hybrid .845 at sup@5.
REFERENCE_SUP5 = {"sparse": 0.824, "dense": 0.777, "hybrid": 0.845}


@pytest.fixture(scope="module")
def faiss_index_dir(tmp_path_factory):
    """FAISS and BM25 only: a GPU host need not carry ChromaDB for this test."""
    out = tmp_path_factory.mktemp("gpu-index")
    build_index(BuildOptions(corpus=CORPUS, out=out, embeddings=EMBEDDINGS))
    return out


@pytest.mark.gpu
def test_gpu_encoder_keeps_recall(faiss_index_dir):
    retriever = load_retriever(RetrieverSettings(index_dir=str(faiss_index_dir)))
    try:
        assert retriever.encoder.device.startswith("cuda")
        ids, scores = retriever.search(["Scott Derrickson", "Ed Wood"], 3, "hybrid")
        assert ids.shape == (2, 3) and (ids >= 0).all() and (scores[:, 0] >= scores[:, 1]).all()
        table = evaluate(retriever, load_qa(QA))
        for mode, reference in REFERENCE_SUP5.items():
            # fp16 queries against fp16-built document vectors: a question or two may move, no more.
            assert table[mode]["sup@5"] == pytest.approx(reference, abs=0.01), (mode, table[mode])
    finally:
        retriever.close()
