"""Start-up by mode: a sparse-only server loads no encoder and no dense index; hybrid loads the encoder once.

The recipes that train on CPU (tiny-cpu, smol-cpu) serve ``mode = "sparse"``; loading MiniLM and exporting it
to ONNX there cost ~10 s (27 s with no ONNX cache) before the first training step, for an encoder never used.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from services.retriever import onnx_encoder
from services.retriever.app import build_app
from services.retriever.chroma import ChromaIndex
from services.retriever.config import RetrieverSettings
from services.retriever.dense import FaissIndex
from services.retriever.encoder import Encoder
from services.retriever.engine import SparseOnlyError
from shared.redis_server import free_port
from tests.integration.retriever.conftest import TEST_SETTINGS, ServerThread

ROOT = Path(__file__).resolve().parents[3]


def _refuse(what: str):
    def refused(*args, **kwargs):
        raise AssertionError(f"a sparse-only retriever constructed {what}")

    return refused


def test_sparse_only_server_constructs_no_encoder_and_refuses_dense(index_dir, monkeypatch):
    for owner, name in [
        (Encoder, "__init__"),
        (onnx_encoder.OnnxEncoder, "__init__"),
        (onnx_encoder, "load_or_export"),
        (FaissIndex, "load"),
        (ChromaIndex, "load"),
    ]:
        monkeypatch.setattr(owner, name, _refuse(f"{getattr(owner, '__name__', owner)}.{name}"))
    app = build_app(RetrieverSettings.load(index_dir=str(index_dir), mode="sparse", **TEST_SETTINGS))
    with ServerThread(app, free_port()) as server:  # a constructor above raising would fail the start-up
        health = httpx.get(server.url + "/health")
        assert health.status_code == 200 and "dense=off" in health.text
        retriever = app.state.retriever
        assert retriever.encoder is None and retriever.dense is None and retriever.sparse_only
        for body in ({}, {"mode": "sparse"}):
            answer = httpx.post(server.url + "/retrieve", json={"queries": ["Scott Derrickson"], **body})
            assert answer.status_code == 200 and len(answer.json()["result"][0]) == 3
        for mode in ("dense", "hybrid"):
            refused = httpx.post(server.url + "/retrieve", json={"queries": ["Scott Derrickson"], "mode": mode})
            assert refused.status_code == 400
            assert refused.json()["error"]["param"] == "mode" and "sparse-only" in refused.json()["error"]["message"]
        with pytest.raises(SparseOnlyError, match="mode=dense"):  # the CLIs' path, without the route
            retriever.search(["Ed Wood"], 3, "dense")
        ids, scores = retriever.search(["Scott Derrickson", "Ed Wood", "Scott Derrickson"], 3, "sparse")
        assert ids.shape == (3, 3) and ids[0].tolist() == ids[2].tolist()  # duplicates searched once
        assert scores[0, 0] >= scores[0, 1] >= scores[0, 2] > 0
        assert "Scott Derrickson" in retriever.corpus.contents(int(ids[0, 0]))


def test_sparse_only_start_up_imports_neither_torch_nor_faiss(index_dir):
    # Importing torch alone is a second or more of the start-up; a fresh process shows what the path pulls in.
    code = (
        "import sys\n"
        "from services.retriever.config import RetrieverSettings\n"
        "from services.retriever.engine import load_retriever\n"
        f"load_retriever(RetrieverSettings(index_dir={str(index_dir)!r}, mode='sparse', cpu_threads=1))\n"
        "print(sorted(m for m in ('torch', 'faiss', 'sentence_transformers', 'onnxruntime') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_hybrid_server_constructs_the_encoder_once_and_warms_it_before_ready(index_dir, monkeypatch):
    encoders, exports = [], []
    real_init, real_load_or_export = Encoder.__init__, onnx_encoder.load_or_export

    def counted_init(self, *args, **kwargs):
        encoders.append(self)
        real_init(self, *args, **kwargs)

    def counted_load_or_export(*args, **kwargs):
        exports.append(args)
        return real_load_or_export(*args, **kwargs)

    monkeypatch.setattr(Encoder, "__init__", counted_init)
    monkeypatch.setattr(onnx_encoder, "load_or_export", counted_load_or_export)
    settings = RetrieverSettings.load(index_dir=str(index_dir), mode="hybrid", onnx_max_queries=None, **TEST_SETTINGS)
    app = build_app(settings)
    with ServerThread(app, free_port()) as server:
        assert httpx.get(server.url + "/health").status_code == 200
        encoder = app.state.retriever.encoder
        assert encoders == [encoder] and encoder.warm_s is not None  # loaded and warmed before any request
        assert len(exports) == (0 if encoder.device.startswith("cuda") else 1)
        for mode in ("dense", "hybrid", "sparse"):
            answer = httpx.post(server.url + "/retrieve", json={"queries": ["Scott Derrickson"], "mode": mode})
            assert answer.status_code == 200 and len(answer.json()["result"][0]) == 3
        assert encoders == [encoder] and len(exports) <= 1  # the requests used it; nothing was loaded again
