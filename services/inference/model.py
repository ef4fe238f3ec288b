"""The served model: a transformers causal LM (optionally wrapped by peft for LoRA adapters) and its tokenizer.

Two forward passes: ``prefill`` (one prompt, no padding, fills a fresh cache) and ``decode`` (one new token
for every running row against the shared ``KVBatch``). With adapters loaded, each row names its adapter and
peft's mixed-batch LoRA path applies it to that row only; base rows get exactly the base computation.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from services.inference.kv import KVBatch
from services.inference.prefix import Hit
from shared.log import get_logger
from shared.precision import Precision, compute_dtype

log = get_logger(__name__)

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed batch


class ModelRunner:
    def __init__(
        self,
        model_dir: str | Path,
        max_model_len: int | None = None,
        precision: Precision = "fp32",
        device: str = "cpu",
    ) -> None:
        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        dtype = compute_dtype(precision, self.device.type)
        # On CPU: fp32 weights and bf16 autocast where the CPU multiplies bf16 natively (shared.precision). On a
        # GPU the weights themselves are bf16, as vLLM serves them and as the trainer holds them there.
        self.autocast = self.device.type == "cpu" and dtype == torch.bfloat16
        weights_dtype = dtype if self.device.type == "cuda" else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.base = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=weights_dtype).to(self.device).eval()
        self.base.requires_grad_(False)
        self.model = self.base  # becomes a peft.PeftModel while adapters are loaded
        self.adapters: set[str] = set()  # names of the loaded LoRA adapters (kept by services.inference.lora)
        self.params: dict[str, torch.Tensor] = dict(self.base.named_parameters())
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

    def _forward(self, adapters: list[str | None], keep: int | torch.Tensor = 1, **inputs) -> torch.Tensor:
        """Logits ``[rows, vocab]`` of each row's last position, or ``[rows, len(keep), vocab]`` at the
        positions of a ``keep`` index tensor (only those rows of hidden states meet the LM head)."""
        if self.has_adapters:
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
                (layer.keys[row : row + 1].index_select(2, keep), layer.values[row : row + 1].index_select(2, keep))
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
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        return logits[0], layers

    @torch.inference_mode()
    def decode(self, kv: KVBatch, tokens: list[int], adapters: list[str | None]) -> torch.Tensor:
        """Logits ``[rows, vocab]`` for each row's newest token; appends that token's column to ``kv``."""
        kv.ensure_capacity(kv.length + 1)
        positions = torch.tensor(kv.real_lengths()).unsqueeze(1)
        logits = self._forward(
            adapters,
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
