"""``sft_only``: a trainer that reads no rollouts makes one demonstration step per loop, checkpoints on stop
and resumes from it (the RED ablations' SFT-only arm and their shared warm start)."""

from __future__ import annotations

import json
import random

import pytest
from pydantic import ValidationError

from services.trainer import checkpoint
from services.trainer.config import TrainerSettings
from services.trainer.loop import Trainer
from tests.integration.trainer import harness as h


def _settings(tmp_path, redis_server, sft, **kw) -> TrainerSettings:
    return TrainerSettings(
        model=str(tmp_path / "model"),
        sft_data=str(sft),
        sft_only=True,
        red={"mode": "fixed"},
        sft_batch=2,
        sft_coef=1.0,
        lr=1e-2,
        checkpoint_every=100,
        redis_url=redis_server.url,
        checkpoint_dir=str(tmp_path / "ckpt"),
        weights_dir=str(tmp_path / "weights"),
        log_dir=str(tmp_path / "logs"),
        port=0,
        **kw,
    )


def test_sft_only_trains_without_rollouts_and_resumes(tmp_path, redis_client, redis_server):
    h.save_tiny_model(tmp_path / "model")
    sft = h.sft_file(tmp_path / "sft.jsonl", random.Random(0), n=5)
    trainer = Trainer(_settings(tmp_path, redis_server, sft, max_steps=3))
    trainer.setup()
    state = trainer.run()  # the stream is empty: a trainer waiting for groups would never get here
    assert (state.step, state.version, state.sft_cursor) == (3, 3, 6)  # taken, not wrapped
    # checkpoint_every is 100: the stop wrote the checkpoint the resumed run starts from
    assert json.loads((checkpoint.latest(tmp_path / "ckpt") / "state.json").read_text())["step"] == 3
    rows = [json.loads(line) for line in (tmp_path / "logs" / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["sft_tokens"] > 0 and r.get("rl_tokens", 0) == 0 for r in rows)

    again = Trainer(_settings(tmp_path, redis_server, sft, max_steps=5))
    again.setup()
    assert again.run().step == 5


def test_sft_only_needs_demonstrations(tmp_path, redis_client, redis_server):
    h.save_tiny_model(tmp_path / "model")
    settings = _settings(tmp_path, redis_server, "x", max_steps=1).model_copy(update={"sft_data": None})
    with pytest.raises(ValueError, match="sft_only needs demonstrations"):
        Trainer(settings).setup()


def test_sft_only_refuses_grpo_only():
    with pytest.raises(ValidationError, match="sft_only"):
        TrainerSettings(sft_only=True, red={"mode": "grpo_only"})
