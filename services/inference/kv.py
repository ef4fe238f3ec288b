"""The batched KV cache of the running sequences, right-aligned so every row writes its next token in one column.

Rows of different lengths are left-padded: row ``b`` holds ``pad[b]`` empty columns, then its real keys and
values. Because every row's newest token sits in the same column, one decode step appends one column for the
whole batch. Buffers are preallocated and grow by doubling, so a step writes in place instead of copying the
cache (``torch.cat`` per step would copy it all, every step). Keys are stored after RoPE, so the padding does
not change any row's positions; the attention mask hides the pad columns.

The buffers take the dtype of the rows they are given (``ModelRunner.kv_dtype``); a step's new column is cast
to it as it is written.

Every method that creates or writes the buffers runs under ``torch.inference_mode``, whoever calls it: decode
grows them inside inference mode (making inference tensors), prefill joins rows on the engine thread outside
it, and an in-place write to an inference tensor outside inference mode is a RuntimeError. Mode is per thread,
so the methods set it themselves instead of trusting the caller's.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class KVBatch:
    """Per-layer key/value buffers ``[rows, kv_heads, capacity, head_dim]`` plus per-row left padding."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.length = 0  # columns in use (pad + real) for every row
        self.pad: list[int] = []

    @property
    def rows(self) -> int:
        return len(self.pad)

    def real_lengths(self) -> list[int]:
        return [self.length - p for p in self.pad]

    def attention_mask(self, extra: int = 1) -> torch.Tensor:
        """``[rows, length + extra]``: 0 on each row's pad columns, 1 on its tokens and the ``extra`` new ones."""
        cols = torch.arange(self.length + extra).unsqueeze(0)
        return (cols >= torch.tensor(self.pad).unsqueeze(1)).long()

    @torch.inference_mode()
    def ensure_capacity(self, needed: int) -> None:
        capacity = self.keys[0].shape[2] if self.keys else 0
        if needed <= capacity:
            return
        new_capacity = max(needed, 2 * capacity, 64)
        self.keys = [_resize(t, new_capacity, self.length) for t in self.keys]
        self.values = [_resize(t, new_capacity, self.length) for t in self.values]

    @torch.inference_mode()
    def add_rows(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Append rows from a prefill cache: per layer (keys, values) ``[b, kv_heads, P, head_dim]``, no padding."""
        new_len = layers[0][0].shape[2]
        target = max(self.length, new_len)
        if self.rows and target > self.length:
            self._shift_right(target - self.length)
        capacity = max(target + 1, self.keys[0].shape[2] if self.keys else 0)
        added = layers[0][0].shape[0]
        merged_k, merged_v = [], []
        for i, (k, v) in enumerate(layers):
            fresh_k = k.new_zeros(added, k.shape[1], capacity, k.shape[3])
            fresh_v = v.new_zeros(added, v.shape[1], capacity, v.shape[3])
            fresh_k[:, :, target - new_len : target] = k
            fresh_v[:, :, target - new_len : target] = v
            if self.rows:
                old_k, old_v = _resize(self.keys[i], capacity, target), _resize(self.values[i], capacity, target)
                fresh_k, fresh_v = torch.cat([old_k, fresh_k]), torch.cat([old_v, fresh_v])
            merged_k.append(fresh_k)
            merged_v.append(fresh_v)
        self.keys, self.values = merged_k, merged_v
        self.pad = self.pad + [target - new_len] * added
        self.length = target

    @torch.inference_mode()
    def keep_rows(self, keep: list[int]) -> None:
        """Drop every row not in ``keep`` (in that order) and trim pad columns no row needs any more."""
        if not keep:
            self.keys, self.values, self.pad, self.length = [], [], [], 0
            return
        index = torch.tensor(keep, device=self.keys[0].device)
        pad = [self.pad[i] for i in keep]
        trim = min(pad)
        self.keys = [t.index_select(0, index)[:, :, trim:].contiguous() for t in self.keys]
        self.values = [t.index_select(0, index)[:, :, trim:].contiguous() for t in self.values]
        self.pad = [p - trim for p in pad]
        self.length -= trim

    @torch.inference_mode()
    def _shift_right(self, by: int) -> None:
        """Add ``by`` pad columns on the left of every row (to align with longer new rows)."""
        self.ensure_capacity(self.length + by + 1)
        for tensors in (self.keys, self.values):
            for t in tensors:
                t[:, :, by : self.length + by] = t[:, :, : self.length].clone()
                t[:, :, :by] = 0
        self.pad = [p + by for p in self.pad]
        self.length += by

    def row(self, index: int) -> KVBatch:
        """Row ``index`` as a one-row batch sharing these buffers: a decode step on it writes its new column
        here (in place), so the engine can run a failed batch's rows one by one. Call ``ensure_capacity`` on
        this batch first: a view that had to grow would write into a copy."""
        view = KVBatch(self.num_layers)
        view.keys = [t[index : index + 1] for t in self.keys]
        view.values = [t[index : index + 1] for t in self.values]
        view.pad, view.length = [self.pad[index]], self.length
        return view

    def as_cache(self) -> DynamicCache:
        """A transformers cache whose layers write the step's new column into these buffers in place."""
        cache = DynamicCache()
        cache.layers = [_SlotLayer(self, i) for i in range(self.num_layers)]
        return cache


def _resize(t: torch.Tensor, capacity: int, used: int) -> torch.Tensor:
    out = t.new_zeros(t.shape[0], t.shape[1], capacity, t.shape[3])
    out[:, :, :used] = t[:, :, :used]
    return out


class _SlotLayer(DynamicLayer):
    """One layer of ``KVBatch`` seen through the transformers cache API (writes at column ``length``)."""

    def __init__(self, batch: KVBatch, index: int) -> None:
        super().__init__()
        self.batch, self.index = batch, index
        self.is_initialized = True

    @torch.inference_mode()
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        start, q = self.batch.length, key_states.shape[-2]
        keys, values = self.batch.keys[self.index], self.batch.values[self.index]
        keys[:, :, start : start + q] = key_states  # cast to the buffers' dtype (the server's kv_dtype)
        values[:, :, start : start + q] = value_states
        keys, values = keys[:, :, : start + q], values[:, :, : start + q]
        if keys.dtype != key_states.dtype and not torch.is_autocast_enabled(keys.device.type):
            # KV stored in another dtype than the forward computes in without autocast (e.g. bf16 KV, fp32
            # compute): the attention needs its own dtype. Under autocast it casts its inputs itself.
            keys, values = keys.to(key_states.dtype), values.to(value_states.dtype)
        return keys, values

    def get_seq_length(self) -> int:
        return self.batch.length
