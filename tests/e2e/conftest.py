"""One local stack (tiny model, lookup index, Redis, retriever, inference, searcher) for the e2e module."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config import StackSettings
from launcher.supervisor import Supervisor
from launcher.train import LocalStack

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory):
    """(stack, supervisor, sft file): servers up, the tiny model and index built, demonstrations made."""
    root = tmp_path_factory.mktemp("stack")
    settings = StackSettings.load(None, run_root=str(root), eval_limit=6, progress_every_s=5)
    stack = LocalStack(str(REPO / "configs" / "tiny-cpu.toml"), settings)
    with Supervisor(stack.run / "logs") as sup:
        stack.prepare(sup)
        stack.start_servers(sup, searcher=True)
        sft = stack.make_sft(sup)
        yield stack, sup, sft
