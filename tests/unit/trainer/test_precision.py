"""Precision: what ``auto`` picks, and the logprob mismatch bf16 autocast brings (visible, and bounded)."""

from __future__ import annotations

import random

import torch

from services.trainer.config import TrainerSettings
from services.trainer.engine import autocast_dtype, param_dtype
from services.trainer.logprobs import PolicyLogprobs, batch_inputs, sequence_logprobs
from services.trainer.packing import TrainSeq, pack
from services.trainer.rl.loss import mismatch_metrics
from shared import precision
from tests.unit.trainer.tiny import tiny_qwen2

CPU = torch.device("cpu")


def test_auto_is_bf16_only_where_the_cpu_multiplies_it_natively(monkeypatch):
    monkeypatch.setattr(precision, "native_bf16", lambda: False)
    assert precision.compute_dtype("auto", "cpu") == torch.float32
    auto = TrainerSettings(precision="auto")
    assert autocast_dtype(auto, CPU) is None and param_dtype(auto, CPU) == torch.float32
    monkeypatch.setattr(precision, "native_bf16", lambda: True)
    assert precision.compute_dtype("auto", "cpu") == torch.bfloat16
    # On CPU the weights stay fp32 (exact optimizer state); the decoder runs under bf16 autocast.
    assert autocast_dtype(auto, CPU) == torch.bfloat16 and param_dtype(auto, CPU) == torch.float32
    # An explicit choice wins over the hardware either way.
    assert precision.compute_dtype("fp32", "cpu") == torch.float32
    assert autocast_dtype(TrainerSettings(precision="fp32"), CPU) is None
    monkeypatch.setattr(precision, "native_bf16", lambda: False)
    assert autocast_dtype(TrainerSettings(precision="bf16"), CPU) == torch.bfloat16


def test_native_bf16_reads_the_cpu_flags(monkeypatch, tmp_path):
    flags = {"avx2 fma": False, "avx2 avx512f avx512_bf16 fma": True, "avx2 amx_bf16 amx_tile": True}
    for line, expected in flags.items():
        info = tmp_path / "cpuinfo"
        info.write_text(f"processor\t: 0\nflags\t\t: fpu {line}\n")
        monkeypatch.setattr(precision, "Path", lambda _path, info=info: info)
        assert precision.native_bf16() is expected, line


def _samples(vocab: int, n: int = 6) -> list[TrainSeq]:
    rng = random.Random(3)
    out = []
    for i in range(n):
        prompt, answer = rng.randint(4, 9), rng.randint(5, 12)
        tokens = [rng.randrange(vocab) for _ in range(prompt + answer)]
        out.append(TrainSeq(tokens, [0] * prompt + [1] * answer, {}, i))
    return out


def test_bf16_autocast_mismatch_is_visible_and_bounded():
    """The trainer under bf16 autocast against an fp32 sampler: the mismatch metrics see the difference
    (it is not silently zero) and it stays small (the head and the softmax are fp32). SmolLM2-135M on real
    sampled text measured mean |Δ log p| 0.025, max 0.11, k3 KL 6e-4 (bench/results/step_profile.md)."""
    model = tiny_qwen2(vocab=256, hidden=64)
    seqs = _samples(256)
    (batch,) = pack(seqs, token_budget=512)
    fp32 = sequence_logprobs(PolicyLogprobs(model), [batch], CPU, all_positions=False)
    bf16 = sequence_logprobs(PolicyLogprobs(model, autocast=torch.bfloat16), [batch], CPU, all_positions=False)
    diffs = torch.cat([torch.tensor(bf16[s.index]) - torch.tensor(fp32[s.index]) for s in seqs])
    assert diffs.abs().max() > 1e-5  # bf16 really ran: not the fp32 numbers again
    assert diffs.abs().max() < 0.1 and diffs.abs().mean() < 0.02
    # What a run reports for it: the sampler's (fp32) logprobs against the trainer's (bf16) ones.
    policy = PolicyLogprobs(model, autocast=torch.bfloat16)
    with torch.no_grad():
        sampler, _ = PolicyLogprobs(model)(**batch_inputs(batch, CPU))
        ours, _ = policy(**batch_inputs(batch, CPU))
    metrics = mismatch_metrics(ours, sampler, batch.target_mask)
    assert 0 < metrics["mismatch_kl_k3"] < 1e-3, metrics
    assert ours.dtype == torch.float32  # logprobs leave the trainer in fp32


def test_tests_compute_in_fp32_even_where_auto_would_pick_bf16(monkeypatch):
    """tests/precision.py: the server's and the trainer's settings, in-process and in a service started with the
    cleaned environment of the trainer harness, resolve to fp32 on a CPU where auto means bf16."""
    from services.inference.config import InferenceSettings
    from tests.integration.trainer.harness import trainer_env

    monkeypatch.setattr(precision, "native_bf16", lambda: True)
    assert precision.compute_dtype(InferenceSettings().precision, "cpu") == torch.float32
    assert precision.compute_dtype(TrainerSettings().precision, "cpu") == torch.float32
    env = trainer_env()
    assert env["CODA_INFERENCE_PRECISION"] == env["CODA_TRAINER_PRECISION"] == "fp32"
