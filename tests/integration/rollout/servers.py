"""Real services for the rollout and searcher integration tests, built once per test process.

``lookup_retriever()`` builds a real retriever index (BM25 + MiniLM FAISS) over the bundled lookup corpus
and serves it; ``tiny_model()`` makes a tiny random Qwen2 with the inference helper's factory. Both are
cached at module level so the rollout and searcher test folders share them. ``completions_stub`` serves a
scripted ``/v1/completions`` handler for a test's own event loop.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from aiohttp import web

from shared.redis_server import free_port
from testing.serving import ThreadedServer

REPO = Path(__file__).resolve().parents[3]
LOOKUP_CORPUS = REPO / "data" / "lookup" / "corpus.jsonl"
_TMP = Path(tempfile.mkdtemp(prefix="coda-rollout-it-"))
atexit.register(shutil.rmtree, _TMP, True)  # registered first, so it runs after the servers have stopped


@functools.lru_cache(maxsize=1)
def lookup_retriever() -> str:
    from services.retriever.app import build_app
    from services.retriever.build import BuildOptions, build_index
    from services.retriever.config import RetrieverSettings

    index = _TMP / "index"
    build_index(BuildOptions(corpus=LOOKUP_CORPUS, out=index, device="cpu"))
    app = build_app(RetrieverSettings(index_dir=str(index), device="cpu", faiss_gpu=False, host="127.0.0.1"))
    server = ThreadedServer(app)
    url = server.start(timeout_s=120)
    atexit.register(server.stop)
    return url


@functools.lru_cache(maxsize=1)
def tiny_model() -> Path:
    from services.inference.factory import build_tiny_model, read_texts

    texts = read_texts([LOOKUP_CORPUS, REPO / "data" / "lookup" / "train.jsonl"], limit=600)
    return build_tiny_model(_TMP / "tiny", texts, size="tiny", seed=0, vocab_size=1024, max_len=2048)


@functools.lru_cache(maxsize=1)
def inference_server() -> str:
    from services.inference.app import create_inference_app
    from services.inference.config import InferenceSettings

    model = tiny_model()
    settings = InferenceSettings(
        model=str(model),
        served_model_name="policy",
        weights_root=str(_TMP),
        max_num_seqs=64,
        max_loras=2,
        max_lora_rank=16,
    )
    server = ThreadedServer(create_inference_app(settings))
    url = server.start(timeout_s=120)
    atexit.register(server.stop)
    return url


@contextlib.asynccontextmanager
async def completions_stub(handler: Callable[[web.Request], Awaitable[web.Response]]) -> AsyncIterator[str]:
    """An aiohttp server on this event loop answering ``POST /v1/completions`` with ``handler``; yields its URL."""
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
