"""``[trainer.lora] layers``: LoRA on the top decoder layers only; backward stops at the lowest adapted layer."""

from __future__ import annotations

import pytest
import torch

from services.trainer.config import TrainerSettings
from services.trainer.engine import load_lm
from services.trainer.logprobs import PolicyLogprobs, batch_inputs
from services.trainer.packing import TrainSeq, pack
from tests.unit.trainer.tiny import tiny_qwen2


def _settings(path, layers: int) -> TrainerSettings:
    return TrainerSettings(
        model=str(path),
        finetune="lora",
        lora={"rank": 4, "targets": ["q_proj", "v_proj", "up_proj"], "layers": layers},
        gradient_checkpointing=True,
    )


def _loss(lm) -> torch.Tensor:
    seqs = [
        TrainSeq(list(range(3, 15)), [0] * 5 + [1] * 7, {}, 0),
        TrainSeq(list(range(20, 29)), [0] * 3 + [1] * 6, {}, 1),
    ]
    (b,) = pack(seqs, 64)
    lm.train()
    logp, _ = PolicyLogprobs(lm)(**batch_inputs(b, torch.device("cpu")))
    return -(logp * b.target_mask).sum()


@pytest.fixture
def model_dir(tmp_path):
    tiny_qwen2(layers=4).save_pretrained(tmp_path)
    return tmp_path


def test_top_layers_get_the_gradient_they_get_under_lora_everywhere(model_dir):
    """At the start (LoRA's B = 0, so the lower adapters change nothing) the top layers' adapters get exactly
    the gradient they get when every layer has one; the lower layers get no adapter and no backward."""
    everywhere, top = load_lm(str(model_dir), _settings(model_dir, 0), torch.float32), None
    top = load_lm(str(model_dir), _settings(model_dir, 2), torch.float32)
    named = dict(everywhere.named_parameters())
    trainable = {n: p for n, p in top.named_parameters() if p.requires_grad}
    assert trainable and all(".layers.2." in n or ".layers.3." in n for n in trainable)
    with torch.no_grad():  # the same initial adapters (B = 0; A random)
        for n, p in trainable.items():
            p.copy_(named[n])
    # B = 0 makes ∂/∂A vanish: give the adapters a nonzero B so that both A and B get a gradient to compare.
    with torch.no_grad():
        for n, p in trainable.items():
            if "lora_B" in n:
                p.normal_(0, 0.1)
                named[n].copy_(p)
        for n, p in named.items():
            if "lora_B" in n and n not in trainable:
                p.zero_()  # lower adapters of the all-layer model: no effect on the forward
    reached = []
    top.get_base_model().model.layers[1].register_full_backward_hook(lambda *_: reached.append(1))
    _loss(everywhere).backward()
    _loss(top).backward()
    assert not reached  # backward never ran through the frozen layer below the adapters
    for n, p in trainable.items():
        assert torch.allclose(p.grad, named[n].grad, atol=1e-6), n


def test_more_layers_than_the_model_has_is_refused(model_dir):
    with pytest.raises(ValueError, match=r"\[trainer.lora\] layers=9 but the model has 4"):
        load_lm(str(model_dir), _settings(model_dir, 9), torch.float32)
