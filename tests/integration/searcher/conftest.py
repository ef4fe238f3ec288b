"""The real retriever over the lookup corpus, shared with the rollout integration tests."""

from __future__ import annotations

import pytest

from tests.integration.rollout.servers import lookup_retriever


@pytest.fixture(scope="session")
def retriever_url() -> str:
    return lookup_retriever()
