"""The query encoder's faster runtimes: an fp32 ONNX Runtime copy (exported once, cached by content, refused when
its vectors differ from torch's) and bf16 torch, both against the fp32 torch encoder on the bundled questions."""

from __future__ import annotations

import numpy as np
import pytest

from services.retriever import encoder as encoder_module
from services.retriever import onnx_encoder
from services.retriever.encoder import Encoder, pick_dtype, resolve_model_path
from services.retriever.evaluate import load_qa
from tests.integration.retriever.conftest import QA

# Mixed lengths in one pass, so padding is exercised (a graph that ignored the mask would fail here).
MIXED = ["Ed Wood", "Which magazine was started first, Arthur's Magazine or First for Women?", "Scott Derrickson"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CODA_ONNX_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def questions():
    return [row["question"] for row in load_qa(QA)[:64]]


@pytest.fixture(scope="module")
def reference():
    return Encoder(batch_size=16, threads=1)  # fp32 torch, no ONNX: the encoder the index was built with


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1)  # both are unit vectors


def test_the_onnx_copy_gives_torch_s_vectors_and_is_exported_once(cache, reference, questions):
    fast = Encoder(batch_size=16, threads=1, dtype="float32", onnx_max_queries=None)
    assert fast.onnx_max_queries == 16  # with an fp32 torch model every pass goes to ONNX Runtime
    graphs = list(cache.glob("*.onnx"))
    assert len(graphs) == 1
    for texts in (MIXED[:1], MIXED, questions):
        assert cosines(fast.encode_queries(texts), reference.encode_queries(texts)).min() > 1 - 1e-5

    stamp = graphs[0].stat().st_mtime_ns
    again = Encoder(batch_size=16, threads=1, dtype="float32", onnx_max_queries=None)
    assert again.onnx_max_queries == 16 and list(cache.glob("*.onnx")) == graphs
    assert graphs[0].stat().st_mtime_ns == stamp  # loaded, not exported again


def test_a_cached_graph_that_disagrees_with_the_model_is_not_used(cache, reference, tmp_path):
    import torch
    from sentence_transformers import SentenceTransformer

    model_dir = resolve_model_path(reference.name)
    other = SentenceTransformer(model_dir, device="cpu")
    with torch.no_grad():
        for param in other.parameters():
            param.mul_(1.05)  # another model with the same file names and shapes
    tokenize = reference._tokenize
    # Planted where load_or_export looks for the real model's graph (as a stale or foreign file would be).
    planted = onnx_encoder.graph_path(model_dir, tmp_path)
    onnx_encoder.export(other, tokenize, planted)
    assert onnx_encoder.load_or_export(reference.model, tokenize, model_dir, cache_dir=tmp_path) is None
    served = Encoder(batch_size=16, threads=1, dtype="float32", onnx_max_queries=None)
    assert served.onnx_max_queries == 16  # the real cache (previous test) still serves: only the planted one is refused


def test_bf16_keeps_the_vectors_and_onnx_takes_the_small_passes(cache, reference, questions):
    fast = Encoder(batch_size=16, threads=1, dtype="bfloat16", onnx_max_queries=None)
    assert fast.dtype == "bfloat16" and fast.onnx_max_queries == 2
    assert cosines(fast.encode_queries(questions), reference.encode_queries(questions)).min() > 0.9995
    # One or two queries: fp32 ONNX Runtime, i.e. the reference's vectors to float noise.
    assert cosines(fast.encode_queries(MIXED[:2]), reference.encode_queries(MIXED[:2])).min() > 1 - 1e-5
    off = Encoder(batch_size=16, threads=1, dtype="bfloat16", onnx_max_queries=0)
    assert off.onnx_max_queries == 0
    assert cosines(off.encode_queries(MIXED[:2]), reference.encode_queries(MIXED[:2])).min() < 1 - 1e-6


def test_dtype_choice(monkeypatch):
    assert pick_dtype("auto", "cuda:0") == "float16" and pick_dtype("float32", "cuda") == "float16"
    assert pick_dtype("float32", "cpu") == "float32" and pick_dtype("bfloat16", "cpu") == "bfloat16"
    monkeypatch.setattr(encoder_module, "native_bf16", lambda: True)
    assert pick_dtype("auto", "cpu") == "bfloat16"
    monkeypatch.setattr(encoder_module, "native_bf16", lambda: False)
    assert pick_dtype("auto", "cpu") == "float32"
