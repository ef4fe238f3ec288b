"""On a CUDA host the encoder runs on the GPU in fp16 (and FAISS moves to the GPU when its build has CUDA)."""

from __future__ import annotations

import pytest

from services.retriever.config import RetrieverSettings
from services.retriever.engine import load_retriever


@pytest.mark.gpu
def test_gpu_encoder_and_search(index_dir):
    retriever = load_retriever(RetrieverSettings(index_dir=str(index_dir)))
    try:
        assert retriever.encoder.device.startswith("cuda")
        ids, scores = retriever.search(["Scott Derrickson", "Ed Wood"], 3, "hybrid")
        assert ids.shape == (2, 3) and (ids >= 0).all() and (scores[:, 0] >= scores[:, 1]).all()
        dense_ids, _ = retriever.search(["Scott Derrickson"], 5, "dense")
        assert "Scott Derrickson" in retriever.corpus.contents(int(dense_ids[0, 0]))
    finally:
        retriever.close()
