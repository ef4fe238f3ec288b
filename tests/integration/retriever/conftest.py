"""A real index built once per session from the bundled corpus and its precomputed embeddings, served by a
real uvicorn server on a free 127.0.0.1 port: once with the FAISS dense backend and once with ChromaDB."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import uvicorn

from services.retriever.app import build_app
from services.retriever.build import BuildOptions, build_index
from services.retriever.config import RetrieverSettings
from shared.redis_server import free_port

DATA = Path(__file__).resolve().parents[3] / "data" / "hotpotqa"
CORPUS = DATA / "corpus.jsonl"
EMBEDDINGS = DATA / "corpus_emb_all-MiniLM-L6-v2_fp16.npy"
QA = DATA / "qa_supported.jsonl"
NUM_DOCS = 6785

# Caps chosen so every limit can be hit cheaply, and topk can exceed the corpus without hitting max_topk.
TEST_LIMITS = {"max_topk": 8000, "max_queries": 5000, "max_body_bytes": 2 * 1024 * 1024}
# One thread: the test machine's two cores are shared with other work (see RetrieverSettings.cpu_threads).
TEST_SETTINGS = {**TEST_LIMITS, "cpu_threads": 1}


@pytest.fixture(scope="session")
def index_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("retriever-index")
    build_index(BuildOptions(corpus=CORPUS, out=out, embeddings=EMBEDDINGS, chroma=True))
    return out


class ServerThread:
    """uvicorn in a background thread; ``url`` once it is accepting connections."""

    def __init__(self, app, port: int) -> None:
        self.app = app
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("retriever server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="session", params=["faiss", "chroma"])
def server(request, index_dir):
    """The running server (``.url``, ``.app``) for each dense backend."""
    settings = RetrieverSettings.load(index_dir=str(index_dir), dense_backend=request.param, **TEST_SETTINGS)
    with ServerThread(build_app(settings), free_port()) as running:
        yield running


@pytest.fixture
def url(server) -> str:
    return server.url + "/retrieve"
