"""Token logprobs and entropies from a causal LM, computed in chunks so the full logits never exist at once.

The decoder runs once over the micro-batch; the output head (hidden → vocabulary) then runs only on the
positions that are needed, ``chunk`` of them at a time, each chunk under activation checkpointing: backward
recomputes one chunk's logits instead of keeping ``tokens × vocab`` floats alive for the whole batch.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from services.trainer.packing import MicroBatch
from services.trainer.rl.entropy import categorical_entropy


def _head_chunk(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, categorical_entropy(logp_all)


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
        logps, ents = [], []
        for i in range(0, h.shape[0], self.chunk):
            args = (head, h[i : i + self.chunk], t[i : i + self.chunk], self.temperature)
            if torch.is_grad_enabled():
                lp, en = checkpoint(_head_chunk, *args, use_reentrant=False)
            else:
                lp, en = _head_chunk(*args)
            logps.append(lp)
            ents.append(en)
        logp = torch.zeros(input_ids.shape, dtype=torch.float32, device=hidden.device)
        ent = torch.zeros_like(logp)
        if logps:
            logp = logp.masked_scatter(where, torch.cat(logps))
            ent = ent.masked_scatter(where, torch.cat(ents))
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
    """Per-sequence token logprobs (token 0 gets 0.0): for tests, the reference model and sync checks."""
    from services.trainer.packing import unpack

    out: dict[int, list[float]] = {}
    for b in batches:
        logp, _ = policy(**batch_inputs(b, device, all_positions=all_positions))
        unpack(logp, b, out)
    return out
