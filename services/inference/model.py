"""The served model: a transformers causal LM (optionally wrapped by peft for LoRA adapters) and its tokenizer.

Two forward passes: ``prefill`` (one prompt, no padding, fills a fresh cache) and ``decode`` (one new token
for every running row against the shared ``KVBatch``). With adapters loaded, a batch whose rows all name one
adapter X (RL: each request names the newest ``policy-vN``) runs with X as peft's active adapter, its plain
path; a batch that mixes adapters (or base rows) names each row's adapter and peft's mixed-batch path applies
it to that row only; base rows get exactly the base computation. The plain path computes what the mixed one
would for those rows, without its row gathers and scatters in each of the 210 LoRA-wrapped linears of
SmolLM2-135M: a 32-row decode step took 0.36 s against 0.46 s per row here (base model: 0.33 s).

Merging (``merge_adapter``): the plain path still costs two small matmuls per wrapped linear. So while every
row of a decode step names the same adapter X, X can be merged into the base weights (W += s·B·A, peft's
``merge``) and the step costs what the base model costs. A forward with any other row (base, another
adapter) unmerges first. Prefill only uses a merge already in place, never starts one: a prompt of another
adapter arriving while a mixed batch decodes would otherwise cost a merge and an unmerge each time. Weight
changes (adapter load/unload, full reload) unmerge first (services.inference.weights).

fp32 rounding: unmerging (W + D) − D gives back W to within an ulp, not bit for bit, for a few elements in a
thousand. The merge records those elements' original values (a sparse list, ~8 bytes each) and the unmerge
writes them back, so base rows after an unmerge again compute on exactly the base weights. Not kept, so within
ulps only: a weight where over 1/32 of the elements would need it (``RESTORE_FRACTION``: a delta as large as
the weights), or the elements a recomputed delta rounds differently (another thread count). Merged rows
differ from the per-row path's by fp32 rounding only. Merging is done only when the forward computes in fp32:
in bf16 (CPU autocast, GPU weights) the merged weight rounds to bf16 with the small delta in it, a change about
as large as bf16's own error that the trainer's unmerged LoRA does not make.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from services.inference.bf16_weights import shared_params, weights_in_bf16
from services.inference.kv import KVBatch
from services.inference.prefix import Hit
from shared.log import get_logger
from shared.precision import Precision, compute_dtype

KVDtype = Literal["auto", "fp32", "bf16"]
KV_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

log = get_logger(__name__)

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed batch
# A merge keeps the original value of the weight elements an unmerge would leave an ulp off, up to 1/this of a
# weight's elements (8 bytes each: at most a quarter byte per weight element, ~6% of fp32 weights).
RESTORE_FRACTION = 32


class ModelRunner:
    def __init__(
        self,
        model_dir: str | Path,
        max_model_len: int | None = None,
        precision: Precision = "fp32",
        device: str = "cpu",
        merge_adapter: bool = False,
        kv_dtype: KVDtype = "auto",
    ) -> None:
        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        dtype = compute_dtype(precision, self.device.type)
        # On CPU: fp32 weights and bf16 autocast where the CPU multiplies bf16 natively (shared.precision). On a
        # GPU the weights themselves are bf16, as vLLM serves them and as the trainer holds them there.
        self.autocast = self.device.type == "cpu" and dtype == torch.bfloat16
        weights_dtype = dtype if self.device.type == "cuda" else torch.float32
        # The KV cache (running batch and prefix cache) is kept in this dtype. Under bf16 autocast the forward
        # makes values in bf16 but keys in fp32 (RoPE multiplies the bf16 projection by fp32 cos/sin), and the
        # attention casts both to bf16 again: bf16 keys there cost nothing in accuracy and halve their bytes.
        self.kv_dtype = dtype if kv_dtype == "auto" else KV_DTYPES[kv_dtype]
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.base = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=weights_dtype).to(self.device).eval()
        self.base.requires_grad_(False)
        if self.autocast:
            weights_in_bf16(self.base)
        self.model = self.base  # becomes a peft.PeftModel while adapters are loaded
        self.adapters: set[str] = set()  # names of the loaded LoRA adapters (kept by services.inference.lora)
        self.params: dict[str, torch.Tensor] = dict(self.base.named_parameters())
        # Merging single-adapter steps (module docstring): only where the forward computes in fp32.
        self.merge_enabled = merge_adapter and weights_dtype == torch.float32 and not self.autocast
        if merge_adapter and not self.merge_enabled:
            log.info("LoRA merging off: the forward computes in bf16, where a merged delta would be rounded")
        self.merged: str | None = None  # the adapter merged into the base weights now, if any
        self.unmergeable: set[str] = set()  # adapters peft cannot merge exactly (variants, tied weights)
        self.on_merge: Callable[[str], None] | None = None  # told "merge" / "unmerge" (metrics)
        self._restore: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (param, flat index, value)
        self._shared = shared_params(self.base)
        self.tied = bool(getattr(self.base.config, "tie_word_embeddings", False))
        config_len = int(getattr(self.base.config, "max_position_embeddings", 2048))
        self.max_model_len = min(max_model_len or config_len, config_len)
        self.num_layers = int(self.base.config.num_hidden_layers)
        self.eos_ids = self._eos_ids()
        # Ids a request may use: tokens of the tokenizer that also have a row in the logits.
        self.vocab_size = min(len(self.tokenizer), int(self.base.get_input_embeddings().num_embeddings))
        # No token stands for more characters than its string has (byte-level BPE: one per byte; SentencePiece:
        # "▁" per space), so text longer than max_model_len × this cannot fit and is refused without tokenising
        # it (a normaliser that deletes characters could make this refuse a prompt that would have fit).
        self.max_token_chars = max(1, max(len(token) for token in self.tokenizer.get_vocab()))
        log.info(
            "model loaded",
            extra={
                "dir": str(self.model_dir),
                "params": self.num_parameters(),
                "max_model_len": self.max_model_len,
                "eos": sorted(self.eos_ids),
                "device": str(self.device),
                "dtype": str(weights_dtype),
                "autocast_bf16": self.autocast,
                "kv_dtype": str(self.kv_dtype),
            },
        )

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (getattr(self.base, "generation_config", None), self.base.config):
            eos = getattr(source, "eos_token_id", None) if source is not None else None
            ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return frozenset(int(i) for i in ids)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.params.values())

    @property
    def has_adapters(self) -> bool:
        return self.model is not self.base

    def _forward(
        self, adapters: list[str | None], keep: int | torch.Tensor = 1, merge: bool = False, **inputs
    ) -> torch.Tensor:
        """Logits ``[rows, vocab]`` of each row's last position, or ``[rows, len(keep), vocab]`` at the
        positions of a ``keep`` index tensor (only those rows of hidden states meet the LM head).

        ``merge``: rows that all name one adapter may merge it (decode); otherwise only an adapter merged
        already serves them merged."""
        if self.has_adapters:
            if not self._one_adapter(adapters, merge):
                inputs["adapter_names"] = [a or BASE_ADAPTER for a in adapters]
        elif any(adapters):
            raise RuntimeError(f"adapter(s) {sorted({a for a in adapters if a})} are not loaded")
        # Callers build ids, masks and positions on the CPU; the KV buffers live on the model's device.
        inputs = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        if isinstance(keep, torch.Tensor):
            keep = keep.to(self.device)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            out = self.model(**inputs, use_cache=True, logits_to_keep=keep)
        logits = out.logits if isinstance(keep, torch.Tensor) else out.logits[:, -1, :]
        # Sampling (services.inference.sampling) runs on the CPU with per-request generators, so the logits come
        # back there: one [rows, vocab] copy per step, small next to a forward pass.
        return logits.float().cpu()

    def _one_adapter(self, adapters: list[str | None], merge: bool) -> bool:
        """Whether these rows all run one adapter without per-row names: merged into the weights, or as peft's
        active adapter (its plain path); merges or unmerges as needed (before the forward: a merge inside the
        bf16 autocast region would compute the delta in bf16). False: base or mixed rows, named per row."""
        names = set(adapters)
        only = next(iter(names)) if len(names) == 1 else None
        if only is not None and only == self.merged:
            return True
        self.unmerge()
        if only is None or only not in self.adapters:
            return False
        if merge and self.merge_enabled and self._merge(only):
            return True
        self._activate(only)
        return True

    def _activate(self, name: str) -> None:
        """Make ``name`` peft's active adapter in every layer (a layer ``name`` does not target then adds
        nothing, and modules_to_save use its copy), as the per-row path would apply it to every row."""
        if list(self.model.active_adapters) != [name]:
            self.model.set_adapter(name, inference_mode=True)

    @torch.inference_mode()
    def _merge(self, name: str) -> bool:
        """Merge adapter ``name`` into the base weights (nothing merged before); False where it cannot be."""
        from peft.tuners.lora import Embedding, Linear
        from peft.tuners.tuners_utils import BaseTunerLayer

        if name in self.unmergeable:
            return False
        layers = [m for m in self.model.modules() if isinstance(m, BaseTunerLayer) and _holds(m, name)]
        why = next((why for layer in layers if (why := self._refuse(layer, name, (Linear, Embedding)))), None)
        if why or not layers:
            self.unmergeable.add(name)
            log.info("LoRA adapter served unmerged", extra={"adapter": name, "reason": why or "no LoRA layers"})
            return False
        # Without adapter_names an unmerged LoRA layer applies its active adapter: make that X everywhere.
        self._activate(name)
        self.merged = name
        try:
            inexact = 0
            for layer in layers:
                inexact += not self._record_rounding(layer, name)
                layer.merge(adapter_names=[name])
        except Exception:
            self.unmerge()
            raise
        log.debug(
            "LoRA adapter merged",
            extra={
                "adapter": name,
                "layers": len(layers),
                "restored_on_unmerge": sum(len(r[1]) for r in self._restore),
                "layers_unmerged_within_ulps": inexact,
            },
        )
        if self.on_merge:
            self.on_merge("merge")
        return True

    def _refuse(self, layer, name: str, kinds: tuple[type, ...]) -> str | None:
        """Why ``layer`` cannot merge ``name`` exactly, or None."""
        if not isinstance(layer, kinds) or name in getattr(layer, "lora_variant", {}):
            return f"{type(layer).__name__} layer (DoRA or another variant, or not a linear/embedding)"
        weight = layer.get_base_layer().weight
        if id(weight) in self._shared:
            return "targets a tied weight (merging would change its twin too)"
        return None

    def _record_rounding(self, layer, name: str) -> bool:
        """Remember the weight elements (and the bias) that ``merge`` then ``unmerge`` would not give back
        exactly: peft's merge adds ``get_delta_weight`` in place, its unmerge subtracts the same value. False
        where more than 1/32 of the weight's elements would need it (a delta as large as the weights): those
        are not kept (memory), and that weight comes back within ulps only."""
        base = layer.get_base_layer()
        weight, exact = base.weight, True
        if weight.is_contiguous():
            delta = layer.get_delta_weight(name).to(weight.dtype)
            flat = weight.detach().view(-1)
            index = (weight + delta).sub_(delta).view(-1).ne(flat).nonzero().squeeze(1)
            if len(index) > flat.numel() // RESTORE_FRACTION:
                exact = False
            elif len(index):
                self._restore.append((flat, index.to(torch.int32), flat[index]))
        else:
            exact = False
        if layer.lora_bias.get(name) and base.bias is not None:
            bias = base.bias.detach()
            self._restore.append((bias, torch.arange(bias.numel(), dtype=torch.int32), bias.clone()))
        return exact

    @torch.inference_mode()
    def unmerge(self) -> None:
        """Take the merged adapter out of the base weights (peft's ``unmerge``), restoring the elements the
        rounding would have left off by an ulp. No-op when nothing is merged."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        if self.merged is None:
            return
        for module in self.model.modules():
            if isinstance(module, BaseTunerLayer) and module.merged:
                module.unmerge()
        for flat, index, values in self._restore:
            flat.index_copy_(0, index.long(), values)
        log.debug("LoRA adapter unmerged", extra={"adapter": self.merged})
        self.merged, self._restore = None, []
        if self.on_merge:
            self.on_merge("unmerge")

    @torch.inference_mode()
    def prefill_batch(self, items: list[tuple[list[int], str | None, Hit | None]]) -> list[tuple[torch.Tensor, list]]:
        """``prefill`` for several prompts in one forward pass.

        Cached prefixes are left-padded to a common length and the new tokens right-padded, so no query row is
        ever fully masked (its first new token is real); pad columns are masked and cut away afterwards.
        """
        if len(items) == 1:
            return [self.prefill(*items[0])]
        starts = [hit.length if hit else 0 for _, _, hit in items]
        suffixes = [prompt[start:] for (prompt, _, _), start in zip(items, starts, strict=True)]
        past, new = max(starts), max(len(x) for x in suffixes)
        ids = torch.full((len(items), new), self.tokenizer.pad_token_id or 0)
        mask = torch.zeros(len(items), past + new, dtype=torch.long)
        positions = torch.zeros(len(items), new, dtype=torch.long)
        for row, (start, suffix) in enumerate(zip(starts, suffixes, strict=True)):
            ids[row, : len(suffix)] = torch.tensor(suffix)
            mask[row, past - start : past + len(suffix)] = 1
            positions[row] = torch.arange(start, start + new)
        cache = DynamicCache(ddp_cache_data=self._padded_past(items, past)) if past else DynamicCache()
        lasts = sorted({len(suffix) - 1 for suffix in suffixes})
        logits = self._forward(
            [adapter for _, adapter, _ in items],
            keep=torch.tensor(lasts),
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
        )
        results = []
        for row, (start, suffix) in enumerate(zip(starts, suffixes, strict=True)):
            keep = torch.cat([torch.arange(past - start, past), torch.arange(past, past + len(suffix))])
            keep = keep.to(self.device)
            layers = [
                (
                    layer.keys[row : row + 1].index_select(2, keep).to(self.kv_dtype),
                    layer.values[row : row + 1].index_select(2, keep).to(self.kv_dtype),
                )
                for layer in cache.layers
            ]
            results.append((logits[row, lasts.index(len(suffix) - 1)], layers))
        return results

    def _padded_past(self, items: list[tuple[list[int], str | None, Hit | None]], past: int) -> list:
        """Per layer (keys, values) ``[rows, heads, past, dim]``: each row's cached prefix, left-padded."""
        template = next(hit.layers for _, _, hit in items if hit)
        layers = []
        for index, (k0, v0) in enumerate(template):
            keys = k0.new_zeros(len(items), k0.shape[1], past, k0.shape[3])
            values = v0.new_zeros(len(items), v0.shape[1], past, v0.shape[3])
            for row, (_, _, hit) in enumerate(items):
                if hit:
                    keys[row, :, past - hit.length :] = hit.layers[index][0][0]
                    values[row, :, past - hit.length :] = hit.layers[index][1][0]
            layers.append((keys, values))
        return layers

    @torch.inference_mode()
    def prefill(self, prompt: list[int], adapter: str | None, cached: Hit | None = None) -> tuple[torch.Tensor, list]:
        """Logits after the prompt ``[vocab]`` and the per-layer (keys, values) ``[1, heads, len, dim]``.

        With a prefix-cache ``cached`` hit only the tokens after its ``length`` go through the model.
        """
        start = cached.length if cached else 0
        cache = DynamicCache(ddp_cache_data=cached.layers) if cached else DynamicCache()
        positions = torch.arange(start, len(prompt)).unsqueeze(0)
        logits = self._forward(
            [adapter], input_ids=torch.tensor([prompt[start:]]), position_ids=positions, past_key_values=cache
        )
        layers = [(layer.keys.to(self.kv_dtype), layer.values.to(self.kv_dtype)) for layer in cache.layers]
        return logits[0], layers

    @torch.inference_mode()
    def decode(self, kv: KVBatch, tokens: list[int], adapters: list[str | None], merge: bool = True) -> torch.Tensor:
        """Logits ``[rows, vocab]`` for each row's newest token; appends that token's column to ``kv``.

        ``merge``: whether rows that all name one adapter may merge it (module docstring)."""
        kv.ensure_capacity(kv.length + 1)
        positions = torch.tensor(kv.real_lengths()).unsqueeze(1)
        logits = self._forward(
            adapters,
            merge=merge,
            input_ids=torch.tensor(tokens).unsqueeze(1),
            attention_mask=kv.attention_mask(1),
            position_ids=positions,
            past_key_values=kv.as_cache(),
        )
        kv.length += 1
        return logits

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=True)["input_ids"]

    def decode_text(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def _holds(layer, name: str) -> bool:
    """Whether a peft tuner layer carries adapter ``name`` (LoRA keeps linears' and embeddings' apart)."""
    return any(name in getattr(layer, attr, ()) for attr in ("lora_A", "lora_embedding_A"))
