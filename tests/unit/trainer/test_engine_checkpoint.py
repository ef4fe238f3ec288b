"""DeepSpeed engine on CPU (gloo, no JIT): a step changes the weights, a checkpoint restores everything."""

from __future__ import annotations

import random

import pytest
import torch

from services.trainer import checkpoint
from services.trainer.config import TrainerSettings
from services.trainer.engine import build_engine, init_distributed
from services.trainer.metrics import RlMetrics
from services.trainer.packing import TrainSeq
from services.trainer.step import RlSums, StepInput, train_step
from tests.unit.trainer.tiny import tiny_qwen2


def reinforce(logp, ent, batch, norms):
    """A test-side loss: −A·logp token-mean (enough to move weights; the real one is the RL objective)."""
    mask = batch.target_mask
    loss = -(logp * batch.fields["adv"] * mask).sum() / norms["tokens"] * norms["world"]
    return loss, RlSums.of(RlMetrics(pg_loss=float(loss.detach())), float(mask.sum()))


def _input(seed: int) -> StepInput:
    rng = random.Random(seed)
    seqs = []
    for i in range(6):
        n = rng.randrange(4, 20)
        tokens = [rng.randrange(64) for _ in range(n)]
        mask = [0, 0] + [1] * (n - 2)
        seqs.append(
            TrainSeq(tokens, mask, {"adv": [rng.uniform(-1, 1)] * n, "old_logp": [0.0] * n, "staleness": [0.0] * n}, i)
        )
    return StepInput(rl=seqs)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tiny_qwen2().save_pretrained(path)
    return path


@pytest.mark.parametrize(
    ("finetune", "stage", "recompute"), [("full", 0, False), ("full", 2, True), ("lora", 0, False), ("lora", 1, True)]
)
def test_step_and_checkpoint_roundtrip(model_dir, tmp_path, finetune, stage, recompute):
    settings = TrainerSettings(
        model=str(model_dir),
        finetune=finetune,
        lr=1e-2,
        warmup_steps=3,
        lora={"rank": 4, "targets": ["q_proj", "v_proj"]},
        micro_batch_tokens=32,
        zero_stage=stage,
        gradient_checkpointing=recompute,
    )
    device = init_distributed()
    eng = build_engine(settings, device)
    before = {k: v.clone() for k, v in eng.policy.state_dict().items()}
    out = train_step(eng, _input(0), reinforce, None, budget=32)
    assert out.micro_batches > 1 and out.rl_tokens > 0 and out.grad_norm > 0
    changed = [k for k, v in eng.policy.state_dict().items() if not torch.equal(v, before[k])]
    assert changed and (finetune == "full" or all("lora" in k for k in changed))
    state = checkpoint.TrainState(step=1, version=1, covered=["1-0"], red={"h": 0.5})
    path = checkpoint.save(eng.engine, state, tmp_path / "ckpt", keep=2, rank=0, world=1)
    torch.manual_seed(123)
    expect_rng = torch.rand(3)
    expect = train_step(eng, _input(1), reinforce, None, budget=32)  # what step 2 does from the checkpoint
    expect_params = {k: v.clone() for k, v in eng.policy.state_dict().items()}

    fresh = build_engine(settings, device)
    restored = checkpoint.load(fresh.engine, path, rank=0)
    assert restored == state
    torch.manual_seed(123)  # the RNG state came back with the checkpoint: the same draws follow
    assert torch.equal(torch.rand(3), expect_rng)
    again = train_step(fresh, _input(1), reinforce, None, budget=32)
    assert again.lr == pytest.approx(expect.lr)  # scheduler restored (warm-up continues)
    for k, v in fresh.policy.state_dict().items():  # optimizer moments restored: identical second step
        assert torch.allclose(v, expect_params[k], atol=1e-6), k


def test_keep_last_k_and_tmp_ignored(model_dir, tmp_path):
    settings = TrainerSettings(model=str(model_dir), micro_batch_tokens=64)
    eng = build_engine(settings, init_distributed())
    root = tmp_path / "ckpt"
    for step in (1, 2, 3):
        checkpoint.save(eng.engine, checkpoint.TrainState(step=step), root, keep=2, rank=0, world=1)
    (root / "step-00000004.tmp").mkdir()  # a crash mid-save
    assert [p.name for p in checkpoint.completed(root)] == ["step-00000002", "step-00000003"]
    assert checkpoint.latest(root).name == "step-00000003"
