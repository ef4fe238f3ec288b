"""Shared fixtures: a throwaway real Redis per test session, and GPU-test skipping."""

from __future__ import annotations

import os

import pytest

from shared.redis_server import RedisServer
from tests.precision import FP32_ENV

# Before any settings class reads the environment (tests/precision.py says why); a value set outside wins.
for _name, _value in FP32_ENV.items():
    os.environ.setdefault(_name, _value)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def redis_server():
    """A real redis-server on a free 127.0.0.1 port for the whole session."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_client(redis_server):
    """A client on a flushed database: every test starts from an empty Redis."""
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()
