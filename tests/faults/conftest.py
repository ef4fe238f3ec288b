"""One real pipeline (launcher's LocalStack: Redis, retriever, inference, trainer, rollout) for the
whole fault-injection module: building and starting it takes a minute, so the faults take turns on it."""

from __future__ import annotations

import pytest

from tests.faults.pipeline import Pipeline


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")  # every child inherits it: a 2-core machine shared with other runs
        pipeline = Pipeline.start(tmp_path_factory.mktemp("faults"))
        try:
            yield pipeline
        finally:
            pipeline.sup.__exit__(None, None, None)  # stops every process, newest first
