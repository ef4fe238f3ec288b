"""Fixtures: the real retriever over the lookup corpus (session), a scripted fake LLM over HTTP (per test)."""

from __future__ import annotations

import pytest

from agents.prompts import CharTokenizer
from services.rollout.config import RolloutSettings
from testing.fake_llm import FakeLLM, protocol_script
from testing.serving import ThreadedServer
from tests.integration.rollout.servers import lookup_retriever


@pytest.fixture(scope="session")
def retriever_url() -> str:
    return lookup_retriever()


@pytest.fixture
def fake_llm():
    fake = FakeLLM(CharTokenizer(), protocol_script)
    with ThreadedServer(fake.app()) as url:
        fake.url = url
        yield fake


@pytest.fixture
def make_settings(redis_server, retriever_url):
    def make(llm_url: str, **overrides) -> RolloutSettings:
        base = dict(
            tokenizer="char",
            inference_url=llm_url,
            retriever_url=retriever_url,
            redis_url=redis_server.url,
            dataset="bundled:lookup",
            n_samples=2,
            groups_per_step=2,
            max_staleness=0,
            retry_attempts=3,
            retry_backoff_s=0.01,
            max_turns=3,
            coda={"executor_max_turns": 2},
            max_tokens_per_turn=200,
            max_context_tokens=8000,
            http_timeout_s=20,
        )
        return RolloutSettings.load(**{**base, **overrides})

    return make
