"""Several ranks, the parts that need no second process: which errors mean a lost rank, a lone rank's
collectives are pass-throughs, a ZeRO checkpoint refuses another world size, a rank's padding batch has a
gradient (the two-node run itself is tests/integration/trainer/test_multinode.py)."""

from __future__ import annotations

import threading

import pytest
import torch

from services.trainer import checkpoint
from services.trainer.batches import Ranks, lost_rank


def test_lost_rank_knows_gloo_and_torch_distributed_errors_and_nothing_else():
    gloo = "[third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:47528: Connection reset by peer"
    assert lost_rank(RuntimeError(gloo))
    assert lost_rank(RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 20000ms for recv"))
    assert lost_rank(torch.distributed.DistStoreError("wait timeout after 8000ms"))
    assert not lost_rank(RuntimeError("CUDA out of memory"))
    assert not lost_rank(ValueError("gloo"))  # not a collective's error type


def test_a_lone_rank_makes_no_collective():
    ranks = Ranks(0, 1)
    assert ranks.broadcast({"a": 1}) == {"a": 1}
    assert ranks.any(True) and not ranks.any(False)
    assert ranks.gather_work(lambda: ["e1", "e2"], threading.Event()) == ["e1", "e2"]
    checkpoint.check_shared("/nonexistent/never/written", ranks)  # nothing to check with one rank


class _Engine:
    def __init__(self, stage: int) -> None:
        self.stage = stage

    def zero_optimization_stage(self) -> int:
        return self.stage


def test_a_partitioned_checkpoint_resumes_only_with_its_world_size(tmp_path):
    (tmp_path / "state.json").write_text(checkpoint.TrainState(step=3, world=2).to_json())
    with pytest.raises(ValueError, match="resume it with 2 ranks, not 1"):
        checkpoint.load(_Engine(stage=2), tmp_path, rank=0, world=1)


def test_a_ranks_padding_batch_backpropagates_zeros_into_every_weight():
    """A rank with fewer micro-batches than another runs ``empty_batch``es: their loss must have a graph
    (DeepSpeed's backward asserts one) that gives every weight a gradient, all zeros."""
    from services.trainer.logprobs import PolicyLogprobs, batch_inputs
    from services.trainer.packing import empty_batch
    from tests.unit.trainer.tiny import tiny_qwen2

    policy = PolicyLogprobs(tiny_qwen2()).train()
    batch = empty_batch(["adv"])
    logp, _ = policy(**batch_inputs(batch, torch.device("cpu")))
    loss = -(logp * batch.target_mask).sum()
    assert loss.grad_fn is not None and loss.item() == 0.0
    loss.backward()
    grads = [p.grad for p in policy.parameters()]
    assert all(g is not None and not g.any() for g in grads)
