"""The head's fused autograd function: the same logprobs, entropies and gradients as plain autograd."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from services.trainer import logprobs as lp_module
from services.trainer.logprobs import HeadLogprobs, PolicyLogprobs, _head_chunk, fusable
from tests.unit.trainer.tiny import tiny_qwen2


def _reference(hidden, weight, targets, temperature):
    """Plain autograd in the inputs' dtype: what ``HeadLogprobs`` must match."""
    logp_all = torch.log_softmax(F.linear(hidden, weight) / temperature, dim=-1)
    return logp_all.gather(-1, targets[:, None]).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


def _grads(fn, hidden, weight, targets, temperature, g_logp, g_ent):
    """Outputs of ``fn`` and the gradients of ``Σ g_logp·logp (+ Σ g_ent·H)`` to ``hidden`` and ``weight``."""
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(weight.requires_grad)
    logp, ent = fn(h, w, targets, temperature)
    loss = (g_logp * logp).sum() + ((g_ent * ent).sum() if g_ent is not None else 0.0)
    inputs = [h, w] if w.requires_grad else [h]
    grads = torch.autograd.grad(loss, inputs)
    return logp, ent, grads


def _chunked(chunk):
    def run(h, w, t, temperature):
        parts = [
            HeadLogprobs.apply(h[i : i + chunk], w, t[i : i + chunk], temperature) for i in range(0, len(h), chunk)
        ]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    return run


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [True, False])
@pytest.mark.parametrize("train_weight", [True, False])
def test_fused_head_matches_autograd(dtype, temperature, entropy_grad, train_weight):
    gen = torch.Generator().manual_seed(int(temperature * 10) + 2 * entropy_grad + 4 * train_weight)
    n, d, vocab, chunk = 23, 16, 50, 5  # 23 rows in chunks of 5: the last chunk is short
    hidden = torch.randn(n, d, generator=gen, dtype=dtype)
    weight = (torch.randn(vocab, d, generator=gen, dtype=dtype) * 0.5).requires_grad_(train_weight)
    targets = torch.randint(vocab, (n,), generator=gen)
    g_logp = torch.randn(n, generator=gen, dtype=dtype)
    g_ent = torch.randn(n, generator=gen, dtype=dtype) if entropy_grad else None
    ref = _grads(_reference, hidden, weight, targets, temperature, g_logp, g_ent)
    got = _grads(_chunked(chunk), hidden, weight, targets, temperature, g_logp, g_ent)
    assert got[0].dtype == got[1].dtype == dtype and len(got[2]) == (2 if train_weight else 1)
    for a, b in zip(got[:2] + tuple(got[2]), ref[:2] + tuple(ref[2]), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_head_matches_the_checkpointed_chunk(temperature, dtype):
    """Against the path it replaces (``_head_chunk`` under checkpointing), both outputs in the loss; in bf16 the
    head matmul and its gradients run in bf16 and the softmax in fp32, as there."""
    torch.manual_seed(3)
    head = torch.nn.Linear(8, 40, bias=False).to(dtype)
    hidden, targets = torch.randn(11, 8, dtype=dtype), torch.randint(40, (11,))
    g_logp, g_ent = torch.randn(11), torch.randn(11)
    h = hidden.clone().requires_grad_(True)
    ref_logp, ref_ent = checkpoint(_head_chunk, head, h, targets, temperature, use_reentrant=False)
    ((g_logp * ref_logp).sum() + (g_ent * ref_ent).sum()).backward()
    weight = head.weight.detach().clone().requires_grad_(True)
    logp, ent, (g_hidden, g_weight) = _grads(HeadLogprobs.apply, hidden, weight, targets, temperature, g_logp, g_ent)
    assert logp.dtype == ent.dtype == torch.float32 and g_hidden.dtype == g_weight.dtype == dtype
    torch.testing.assert_close(logp, ref_logp, atol=0, rtol=0)  # the forward is the same computation
    torch.testing.assert_close(ent, ref_ent, atol=0, rtol=0)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(g_hidden, h.grad, atol=tol, rtol=tol)
    torch.testing.assert_close(g_weight, head.weight.grad, atol=tol, rtol=tol)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_gradient_formulas_by_hand(temperature):
    # W = I and hidden = T·(ln 2, 0, 0): tempered logits (ln 2, 0, 0), p = (1/2, 1/4, 1/4), target 0.
    # log p = (−ln 2, −2 ln 2, −2 ln 2); H = ½ ln 2 + ½ · 2 ln 2 = 1.5 ln 2.
    # d log p_0/dz = onehot − p = (½, −¼, −¼); dH/dz = −p·(log p + H) = (−¼ ln 2, ⅛ ln 2, ⅛ ln 2).
    ln2 = math.log(2)
    weight = torch.eye(3, dtype=torch.float64, requires_grad=True)
    hidden = torch.tensor([[temperature * ln2, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    logp, ent = HeadLogprobs.apply(hidden, weight, torch.tensor([0]), temperature)
    torch.testing.assert_close(logp, torch.tensor([-ln2], dtype=torch.float64))
    torch.testing.assert_close(ent, torch.tensor([1.5 * ln2], dtype=torch.float64))
    (logp.sum() + 2.0 * ent.sum()).backward()  # g_logp = 1, g_H = 2
    g_logits = torch.tensor([0.5 - 0.5 * ln2, -0.25 + 0.25 * ln2, -0.25 + 0.25 * ln2], dtype=torch.float64)
    torch.testing.assert_close(hidden.grad, (g_logits / temperature)[None])  # W = I: grad_hidden = g_z / T
    want_w = torch.zeros(3, 3, dtype=torch.float64)
    want_w[:, 0] = g_logits * ln2  # (g_z / T) ⊗ hidden: only column 0, hidden_0 = T·ln 2
    torch.testing.assert_close(weight.grad, want_w)


def test_backward_keeps_no_vocabulary_sized_tensor():
    """Saved for backward: the hidden chunk, the weight and per-row values, never a rows × vocab tensor."""
    n, vocab = 6, 30
    weight = torch.randn(vocab, 4, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        HeadLogprobs.apply(torch.randn(n, 4, requires_grad=True), weight, torch.zeros(n, dtype=torch.long), 0.7)
    assert saved and (n, vocab) not in saved and all(s[0] == n for s in saved if s != weight.shape)


@pytest.mark.parametrize("train_embedding", [True, False])
def test_policy_gradients_unchanged_through_a_tied_head(monkeypatch, train_embedding):
    """Whole model, tied embeddings (Qwen2/SmolLM2 style): every parameter's gradient matches the old path."""
    model = tiny_qwen2(vocab=48)
    model.get_input_embeddings().weight.requires_grad_(train_embedding)  # frozen: the LoRA case
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert fusable(model.get_output_embeddings())
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(48, (2, 13), generator=gen)
    targets = torch.randint(48, (2, 13), generator=gen)
    select = torch.rand(2, 13, generator=gen) > 0.2
    g_logp, g_ent = torch.randn(2, 13, generator=gen), torch.randn(2, 13, generator=gen)
    positions = torch.arange(13).expand(2, 13)

    def run():
        model.zero_grad(set_to_none=True)
        logp, ent = PolicyLogprobs(model, chunk=4, temperature=0.7)(ids, positions, None, targets, select)
        ((g_logp * logp).sum() + (g_ent * ent).sum()).backward()
        return logp, ent, {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    def no_checkpoint(*args, **kwargs):
        raise AssertionError("a fusable head took the checkpointed path")

    with monkeypatch.context() as m:
        m.setattr(lp_module, "checkpoint", no_checkpoint)
        new = run()
    monkeypatch.setattr(lp_module, "fusable", lambda head: False)
    old = run()
    torch.testing.assert_close(new[0], old[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(new[1], old[1], atol=1e-6, rtol=0)
    assert new[2].keys() == old[2].keys() and ("model.embed_tokens.weight" in new[2]) == train_embedding
    for name in new[2]:
        torch.testing.assert_close(new[2][name], old[2][name], atol=1e-5, rtol=1e-5, msg=name)


def test_heads_it_cannot_fuse_take_the_checkpointed_path():
    assert fusable(torch.nn.Linear(4, 8, bias=False))
    assert not fusable(torch.nn.Linear(4, 8))  # a bias
    wrapped = torch.nn.Linear(4, 8, bias=False)
    wrapped.weight.ds_id = 0  # what ZeRO-3 marks its partitioned parameters with
    assert not fusable(wrapped)
