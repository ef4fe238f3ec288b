"""The services the fuzz suite drives, each started for real on 127.0.0.1 (module scope: one per test file).

Built from the fixtures the other integration tests use: the tiny random Qwen2 and the lookup corpus
(``tests.integration.rollout.servers``), the scripted fake LLM (``testing.fake_llm``), a real Redis.
The inference server's weights folder is empty, so no fuzzed load or reload can find weights to apply.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from agents.prompts import CharTokenizer
from testing.fake_llm import FakeLLM, protocol_script
from testing.serving import ThreadedServer
from tests.integration.rollout.servers import LOOKUP_CORPUS, tiny_model


@pytest.fixture(scope="module")
def fuzz_retriever(tmp_path_factory):
    """(url, app) of a retriever over the lookup corpus: BM25 + MiniLM FAISS, hybrid by default."""
    from services.retriever.app import build_app
    from services.retriever.build import BuildOptions, build_index
    from services.retriever.config import RetrieverSettings

    index = tmp_path_factory.mktemp("fuzz-index")
    build_index(BuildOptions(corpus=LOOKUP_CORPUS, out=index, device="cpu"))
    app = build_app(RetrieverSettings(index_dir=str(index), device="cpu", faiss_gpu=False, cpu_threads=1))
    with ThreadedServer(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def fuzz_inference(tmp_path_factory):
    """(url, app) of the inference server of the tiny model (served as ``policy``, 256-token context)."""
    from services.inference.app import create_inference_app
    from services.inference.config import InferenceSettings

    empty: Path = tmp_path_factory.mktemp("fuzz-weights")
    settings = InferenceSettings(
        model=str(tiny_model()),
        served_model_name="policy",
        weights_root=str(empty),
        max_model_len=256,
        max_num_seqs=8,
        max_loras=2,
        max_lora_rank=16,
        threads=1,
    )
    app = create_inference_app(settings)
    with ThreadedServer(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def fake_llm():
    fake = FakeLLM(CharTokenizer(), protocol_script)
    with ThreadedServer(fake.app()) as url:
        fake.url = url
        yield fake


@pytest.fixture(scope="module")
def fuzz_searcher(fake_llm, fuzz_retriever):
    """(url, app) of the searcher: the scripted LLM (char tokenizer) and the real retriever."""
    from services.searcher.app import build_app
    from services.searcher.config import SearcherSettings

    settings = SearcherSettings(
        inference_url=fake_llm.url, retriever_url=fuzz_retriever[0], tokenizer="char", retry_attempts=1
    )
    app = build_app(settings)
    with ThreadedServer(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def fuzz_rollout(fake_llm, fuzz_retriever, redis_server):
    """(url, app) of a rollout producing CoDA groups into Redis from the scripted LLM (two groups, then it
    waits for a new policy version that never comes: admission holds it, the routes stay busy-free)."""
    from services.rollout.app import build_app
    from services.rollout.config import RolloutSettings

    client = redis_server.client()
    client.flushall()
    settings = RolloutSettings.load(
        tokenizer="char",
        inference_url=fake_llm.url,
        retriever_url=fuzz_retriever[0],
        redis_url=redis_server.url,
        dataset="bundled:lookup",
        agent="coda",
        n_samples=2,
        groups_per_step=2,
        max_staleness=0,
        retry_attempts=2,
        retry_backoff_s=0.01,
        max_turns=3,
        max_tokens_per_turn=200,
        max_context_tokens=8000,
        http_timeout_s=20,
    )
    app = build_app(settings)
    with ThreadedServer(app) as url:
        yield url, app
    client.flushall()
    client.close()


@pytest.fixture(scope="module")
def fuzz_trainer():
    """(url, app) of the trainer's HTTP face over a ready stand-in trainer (the real one needs a training run;
    its app reads only these attributes)."""
    from services.trainer.app import build_app

    ready = threading.Event()
    ready.set()
    trainer = SimpleNamespace(
        ready=ready,
        steps_without_rl=1,
        state=SimpleNamespace(step=7, version=3, tokens=1234, groups_trained=14, dropped_stale=2),
    )
    app, _registry = build_app(lambda: trainer)
    with ThreadedServer(app) as url:
        yield url, app
