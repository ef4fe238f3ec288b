"""Prefix cache: the KV of finished sequences, reused when a new prompt starts with one of them.

Multi-turn agents send each turn as the exact previous ids plus new ones (token-in/token-out), and GRPO sends
the same prompt several times; without this every turn would prefill its whole history again. Entries are
keyed by (adapter, token ids) and belong to one weight version: a full reload clears the cache, unloading an
adapter drops its entries, so reused KV always comes from the weights now served. Least recently used entries
go first once ``max_tokens`` cached tokens are exceeded.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values) [1, kv_heads, length, head_dim]


@dataclass
class Hit:
    length: int  # leading prompt tokens whose KV is reused
    layers: Layers


class PrefixCache:
    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.entries: OrderedDict[tuple[str | None, tuple[int, ...]], Layers] = OrderedDict()
        self.tokens = 0
        self.hits = 0
        self.reused_tokens = 0

    @property
    def enabled(self) -> bool:
        return self.max_tokens > 0

    def put(self, adapter: str | None, ids: list[int], layers: Layers) -> None:
        """Remember the KV of ``ids`` (the tokens that went through the model, in order)."""
        if not self.enabled or not ids or len(ids) > self.max_tokens:
            return
        key = (adapter, tuple(ids))
        if key in self.entries:
            self.entries.move_to_end(key)
            return
        self.entries[key] = layers
        self.tokens += len(ids)
        while self.tokens > self.max_tokens:
            (_, old_ids), _ = self.entries.popitem(last=False)
            self.tokens -= len(old_ids)

    def get(self, adapter: str | None, prompt: list[int]) -> Hit | None:
        """The longest cached prefix of ``prompt`` (leaving at least one token to run, for the logits)."""
        if not self.enabled:
            return None
        best_key, best_len = None, 0
        limit = len(prompt) - 1
        wanted = tuple(prompt)
        for key in self.entries:
            key_adapter, ids = key
            length = min(len(ids), limit)
            if key_adapter != adapter or length <= best_len:
                continue
            if wanted[:length] == ids[:length]:
                best_key, best_len = key, length
        if best_key is None:
            return None
        self.entries.move_to_end(best_key)
        self.hits += 1
        self.reused_tokens += best_len
        layers = [(k[:, :, :best_len], v[:, :, :best_len]) for k, v in self.entries[best_key]]
        return Hit(best_len, layers)

    def drop_adapter(self, adapter: str) -> None:
        for key in [k for k in self.entries if k[0] == adapter]:
            self.tokens -= len(key[1])
            del self.entries[key]

    def clear(self) -> None:
        self.entries.clear()
        self.tokens = 0
