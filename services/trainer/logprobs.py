"""Token logprobs and entropies from a causal LM, computed in chunks so the full logits never exist at once.

The decoder runs once over the micro-batch; the output head (hidden → vocabulary) then runs only on the
positions that are needed, ``chunk`` of them at a time. Each chunk goes through ``HeadLogprobs``, an autograd
function that keeps only the chunk's hidden states (and a per-position log Z and entropy) for backward, which
recomputes the chunk's logits once and applies the analytic gradients of log-softmax and entropy: neither
``tokens × vocab`` floats for the whole batch nor the autograd graph of the softmax stays alive.
Heads it cannot see through (a bias, a peft wrapper, ZeRO-3 partitioned weights) take the generic path:
``_head_chunk`` under activation checkpointing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from services.trainer.packing import MicroBatch


def categorical_entropy(logp_all: torch.Tensor) -> torch.Tensor:
    """Per-position entropy −Σ p·log p from full-vocabulary log-probabilities (``log_softmax`` of the logits).

    THE entropy estimator, on both the RL and the SFT side (RED compares the two, so they must match): this
    forward pass is the one place it is computed, and ``HeadLogprobs.backward`` holds its gradient. (RED-CoDA
    compared the SFT side's categorical entropy with the RL side's sampled-token NLL: different quantities.)
    From log-probabilities, in float32 (or float64 if given that): a token whose probability underflows to 0
    still has a finite log p here, so its term is 0·(−200) = 0, where log(softmax(z)) would give 0·(−inf) = NaN.
    """
    logp = logp_all.to(torch.promote_types(logp_all.dtype, torch.float32))
    return -(logp.exp() * logp).sum(-1)


def _head_chunk(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, categorical_entropy(logp_all)


def _logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """``hidden @ weight.T / temperature``: the matmul in the weight's dtype, the rest in (at least) fp32."""
    with torch.autocast(hidden.device.type, enabled=False):  # backward may run inside the caller's autocast
        logits = F.linear(hidden, weight).to(torch.promote_types(weight.dtype, torch.float32))
    return logits.div_(temperature) if temperature != 1.0 else logits


class HeadLogprobs(torch.autograd.Function):
    """``(log p(target), H)`` per row of ``hidden`` for a bias-free head ``weight``, at ``temperature``.

    With z the tempered logits, p = softmax(z): d log p_t / dz = onehot(t) − p and dH/dz = −p·(log p + H)
    (H = −Σ p·log p). Backward combines both with the incoming gradients, divides by the temperature and
    multiplies through the head: grad_hidden = g @ W, grad_W = gᵀ @ hidden (skipped when W is frozen, as under
    LoRA; a tied embedding receives it like any other use of the parameter).
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature):
        logits = _logits(hidden, weight, temperature)
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        log_z = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logp  # log p = z − log Z in backward
        del logits
        entropy = categorical_entropy(logp_all)
        ctx.save_for_backward(hidden, weight, targets, log_z, entropy)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)  # an entropy only logged (detached) sends None: skip its term
        return logp, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, g_logp, g_entropy):
        hidden, weight, targets, log_z, entropy = ctx.saved_tensors
        if g_logp is None and g_entropy is None:
            return None, None, None, None
        logp_all = _logits(hidden, weight, ctx.temperature).sub_(log_z.unsqueeze(-1))
        if g_entropy is None:
            g = logp_all.exp_().mul_(-g_logp.unsqueeze(-1))  # −p·g_logp, in the logits' buffer
        else:
            p = logp_all.exp()
            inner = logp_all.add_(entropy.unsqueeze(-1)).mul_(g_entropy.unsqueeze(-1))  # (log p + H)·g_H
            if g_logp is not None:
                inner.add_(g_logp.unsqueeze(-1))
            g = p.mul_(inner).neg_()
        if g_logp is not None:
            g.scatter_add_(-1, targets.unsqueeze(-1), g_logp.unsqueeze(-1).to(g.dtype))
        if ctx.temperature != 1.0:
            g.div_(ctx.temperature)
        g = g.to(weight.dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            grad_hidden = g @ weight if ctx.needs_input_grad[0] else None
            grad_weight = g.t() @ hidden if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None


def fusable(head: nn.Module) -> bool:
    """Whether ``HeadLogprobs`` computes exactly what ``head`` does: a plain bias-free ``nn.Linear``.

    SmolLM2 and Qwen2 heads are (tied to the input embedding or not). A peft wrapper of the head is not a
    ``nn.Linear``; ZeRO-3 partitioned weights (``ds_id``) are gathered only by the head's own forward hooks.
    """
    return type(head) is nn.Linear and head.bias is None and not hasattr(head.weight, "ds_id")


class PolicyLogprobs(nn.Module):
    """Wraps a Hugging Face causal LM (optionally a peft model); ``forward`` returns per-position values.

    This is the module DeepSpeed wraps, so ``engine(batch)`` gives logprobs with gradients.
    """

    def __init__(
        self, lm: nn.Module, chunk: int = 1024, temperature: float = 1.0, autocast: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.lm = lm
        self.chunk = chunk
        self.temperature = temperature
        self.autocast = autocast  # CPU bf16 autocast of the decoder (engine.autocast_dtype); None: off

    def base(self) -> nn.Module:
        """The transformers model (under a peft wrapper if there is one)."""
        return self.lm.get_base_model() if hasattr(self.lm, "get_base_model") else self.lm

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        targets: torch.Tensor,
        select: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logprobs, entropies)`` of ``targets``, shaped like ``input_ids``; 0 where ``select`` is False."""
        base = self.base()
        with torch.autocast(input_ids.device.type, dtype=self.autocast or torch.bfloat16, enabled=bool(self.autocast)):
            hidden = base.get_decoder()(
                input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=False
            ).last_hidden_state
        # The head and everything after it in fp32: logprobs of a 49k-way softmax are where bf16 would hurt.
        head = base.get_output_embeddings()
        hidden = hidden.to(head.weight.dtype)
        where = select.bool()
        h = hidden[where]
        t = targets[where]
        fused = fusable(head)
        logps, ents = [], []
        for i in range(0, h.shape[0], self.chunk):
            hc, tc = h[i : i + self.chunk], t[i : i + self.chunk]
            if fused:
                lp, en = HeadLogprobs.apply(hc, head.weight, tc, self.temperature)
            elif torch.is_grad_enabled():
                lp, en = checkpoint(_head_chunk, head, hc, tc, self.temperature, use_reentrant=False)
            else:
                lp, en = _head_chunk(head, hc, tc, self.temperature)
            logps.append(lp)
            ents.append(en)
        logp = torch.zeros(input_ids.shape, dtype=torch.float32, device=hidden.device)
        ent = torch.zeros_like(logp)
        if logps:
            logp = logp.masked_scatter(where, torch.cat(logps))
            ent = ent.masked_scatter(where, torch.cat(ents))
        elif torch.is_grad_enabled():
            # Nothing selected (the padding batch of a rank with fewer micro-batches, ``packing.empty_batch``):
            # a zero that still reaches the decoder and the head, so the loss has a graph (DeepSpeed's backward
            # refuses one without) and every weight's gradient hook fires on every rank alike.
            logp = logp + head(hidden[:, :1]).sum() * 0.0
        return logp, ent


def batch_inputs(batch: MicroBatch, device: torch.device, all_positions: bool = False) -> dict[str, torch.Tensor]:
    """Keyword arguments of ``PolicyLogprobs.forward`` for ``batch`` on ``device``."""
    select = (batch.seq >= 0) if all_positions else batch.target_mask > 0
    return {
        "input_ids": batch.input_ids.to(device),
        "position_ids": batch.position_ids.to(device),
        "attention_mask": None if batch.attention_mask is None else batch.attention_mask.to(device),
        "targets": batch.targets.to(device),
        "select": select.to(device),
    }


@torch.no_grad()
def sequence_logprobs(
    policy: PolicyLogprobs, batches: list[MicroBatch], device: torch.device, all_positions: bool = True
) -> dict[int, list[float]]:
    """Per-sequence token logprobs (token 0 gets 0.0), outside a training step: the sync check's."""
    out: dict[int, list[float]] = {}
    for b in batches:
        logp, _ = policy(**batch_inputs(b, device, all_positions=all_positions))
        unpack(logp, b, out)
    return out


def unpack(values: torch.Tensor, batch: MicroBatch, out: dict[int, list[float]]) -> None:
    """Scatter per-position ``values`` back to per-sequence lists aligned with the tokens.

    ``out[index][t]`` is the value for token ``t`` (token 0 has none: it stays 0.0).
    """
    flat_seq = batch.seq.reshape(-1).tolist()
    flat_val = values.detach().reshape(-1).tolist()
    flat_pos = batch.position_ids.reshape(-1).tolist()
    seen: set[int] = set()
    for s, v, p in zip(flat_seq, flat_val, flat_pos, strict=True):
        if s < 0:
            continue
        seen.add(s)
        row = out.setdefault(s, [0.0])
        if len(row) == p + 1:
            row.append(v)
    for s in seen:
        del out[s][-1:]  # the last position of a sequence predicts nothing
