"""One optimizer step: the gradient does not depend on how the batch is split; the SFT term is added once."""

from __future__ import annotations

import random

import pytest

from services.trainer.batches import teaching
from services.trainer.config import TrainerSettings
from services.trainer.engine import build_engine, init_distributed
from services.trainer.packing import TrainSeq
from services.trainer.step import Objective, StepInput, train_step
from tests.unit.trainer.tiny import tiny_qwen2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-step")
    tiny_qwen2().save_pretrained(path)
    return path


def _seqs(seed: int, n: int = 6, with_fields: bool = True) -> list[TrainSeq]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = rng.randrange(5, 20)
        fields = (
            {"old_logp": [-4.0] * k, "adv": [rng.uniform(-1, 1)] * k, "staleness": [0.0] * k} if with_fields else {}
        )
        out.append(TrainSeq([rng.randrange(64) for _ in range(k)], [0, 0] + [1] * (k - 2), fields, i))
    return out


@pytest.mark.parametrize("packing", [True, False])
def test_gradient_independent_of_micro_batch_split(model_dir, packing):
    settings = TrainerSettings(model=str(model_dir), lr=1e-9)  # tiny lr: the weights barely move between steps
    eng = build_engine(settings, init_distributed())
    norms = []
    for budget in (16, 40, 1000):
        out = train_step(eng, StepInput(_seqs(0)), Objective(settings), None, budget, packing=packing)
        norms.append((out.micro_batches, out.grad_norm, out.metrics.rl.means().pg_loss))
    assert norms[0][0] > norms[1][0] > norms[2][0] == 1
    assert [n[1] for n in norms] == pytest.approx([norms[2][1]] * 3, rel=1e-4)
    assert [n[2] for n in norms] == pytest.approx([norms[2][2]] * 3, rel=1e-4, abs=1e-7)


def test_sft_term_weighted_once_per_step(model_dir):
    settings = TrainerSettings(model=str(model_dir), lr=1e-9)
    eng = build_engine(settings, init_distributed())
    rl = _seqs(1)
    for s in rl:
        s.fields["adv"][:] = [0.0] * len(s.tokens)  # no RL signal: any gradient comes from the SFT term
    sft = _seqs(2, n=3, with_fields=False)
    off = train_step(eng, StepInput(rl, sft, 0.0), Objective(settings), None, 32)
    one = train_step(eng, StepInput(rl, sft, 1.0), Objective(settings), None, 32)
    two = train_step(eng, StepInput(rl, sft, 2.0), Objective(settings), None, 32)
    assert off.grad_norm == pytest.approx(0.0, abs=1e-9) and off.sft_tokens > 0
    assert off.sft_loss() is None and off.sft_entropy() is None  # weight 0: the demonstrations were not run
    assert one.sft_loss() == pytest.approx(two.sft_loss(), rel=1e-5) and 3.5 < one.sft_loss() < 5.0  # ≈ ln 64
    assert two.grad_norm == pytest.approx(2 * one.grad_norm, rel=1e-4)
    assert one.sft_entropy() == pytest.approx(4.15, abs=0.1)


def test_skipping_samples_without_advantage_keeps_the_whole_batchs_gradient(model_dir):
    """zero_advantage = "skip": samples of advantage 0 are not run, yet the loss keeps them in its normaliser, so
    the gradient equals the one of training all; "drop" normalises over the trained ones (larger by the ratio)."""
    settings = TrainerSettings(model=str(model_dir), lr=1e-9)
    eng = build_engine(settings, init_distributed())
    seqs = _seqs(3, n=8)
    for s in seqs[::2]:
        s.fields["adv"][:] = [0.0] * len(s.tokens)
    kept, skipped = teaching(seqs)
    assert skipped == 4 and len(kept) == 4
    every = train_step(eng, StepInput(seqs), Objective(settings), None, 1000)
    skip = train_step(eng, StepInput(kept, rl_norm=seqs), Objective(settings), None, 1000)
    drop = train_step(eng, StepInput(kept), Objective(settings), None, 1000)
    assert skip.rl_tokens < every.rl_tokens and every.grad_norm > 1e-6
    assert skip.grad_norm == pytest.approx(every.grad_norm, rel=1e-5)
    assert drop.grad_norm == pytest.approx(every.grad_norm * every.rl_tokens / skip.rl_tokens, rel=1e-5)


def test_a_step_of_samples_without_advantage_trains_its_shortest_one_with_zero_gradient(model_dir):
    settings = TrainerSettings(model=str(model_dir), lr=1e-9)
    eng = build_engine(settings, init_distributed())
    seqs = _seqs(4, n=5)
    for s in seqs:
        s.fields["adv"][:] = [0.0] * len(s.tokens)
    assert teaching(seqs) == ([], 5)  # drop: nothing left, no step
    kept, skipped = teaching(seqs, keep_one=True)
    assert skipped == 4 and len(kept[0].tokens) == min(len(s.tokens) for s in seqs) and kept[0].index == 0
    out = train_step(eng, StepInput(kept, rl_norm=seqs), Objective(settings), None, 1000)
    assert out.trained and out.grad_norm == 0.0
