"""Prefix cache: the KV of finished sequences, reused when a new prompt starts with one of them.

Multi-turn agents send each turn as the exact previous ids plus new ones (token-in/token-out), and GRPO sends
the same prompt several times; without this every turn would prefill its whole history again. Entries are
keyed by (adapter, token ids) and belong to one weight version: a full reload clears the cache, unloading an
adapter drops its entries, so reused KV always comes from the weights now served. Least recently used entries
go first once ``max_bytes`` bytes of KV (or ``max_tokens`` cached tokens, when set) are exceeded.

Lookups do not scan the entries: each entry's ids are cut into blocks of ``BLOCK`` tokens and every block is
indexed by the hash of the whole prefix up to its end (a chain hash, with the adapter and the block number in
the key). ``get`` walks the prompt's blocks while the index knows them (one dict lookup a block), then compares
the few tokens after the deepest shared block against the entries sharing it, and checks the winner's ids
once against the prompt (a hash collision falls back to a scan). The KV bytes held are ``nbytes``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import count

import torch

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values) [1, kv_heads, length, head_dim]

BLOCK = 16  # tokens per indexed block: a lookup compares at most this many tokens per candidate entry


@dataclass
class Hit:
    length: int  # leading prompt tokens whose KV is reused
    layers: Layers


@dataclass
class _Entry:
    adapter: str | None
    ids: tuple[int, ...]
    layers: Layers
    nbytes: int
    keys: list[tuple] = field(default_factory=list)  # the index keys it is filed under


def layers_nbytes(layers: Layers) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)


def _chain(ids: tuple[int, ...] | list[int], blocks: int) -> list[int]:
    """Hashes of the prefixes ``ids[:B]``, ``ids[:2B]``, … (``blocks`` of them)."""
    out, h = [], 0
    for j in range(blocks):
        h = hash((h, tuple(ids[j * BLOCK : (j + 1) * BLOCK])))
        out.append(h)
    return out


class PrefixCache:
    def __init__(self, max_tokens: int | None = None, max_bytes: int | None = None) -> None:
        """``max_tokens`` / ``max_bytes``: bounds on the tokens / KV bytes held (None: that bound is off);
        either one 0 turns the cache off."""
        self.max_tokens, self.max_bytes = max_tokens, max_bytes
        self.entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self.by_ids: dict[tuple[str | None, tuple[int, ...]], int] = {}
        self.index: dict[tuple, set[int]] = {}  # (adapter, block number, chain hash) -> entry ids
        self._ids = count()
        self.tokens = 0
        self.nbytes = 0
        self.hits = 0
        self.reused_tokens = 0

    @property
    def enabled(self) -> bool:
        return self.max_tokens != 0 and self.max_bytes != 0

    def _over(self) -> bool:
        return (self.max_tokens is not None and self.tokens > self.max_tokens) or (
            self.max_bytes is not None and self.nbytes > self.max_bytes
        )

    def put(self, adapter: str | None, ids: list[int], layers: Layers) -> None:
        """Remember the KV of ``ids`` (the tokens that went through the model, in order)."""
        if not self.enabled or not ids:
            return
        nbytes = layers_nbytes(layers)
        if (self.max_tokens is not None and len(ids) > self.max_tokens) or (
            self.max_bytes is not None and nbytes > self.max_bytes
        ):
            return
        key = tuple(ids)
        if (adapter, key) in self.by_ids:
            self.entries.move_to_end(self.by_ids[adapter, key])
            return
        eid = next(self._ids)
        entry = _Entry(adapter, key, layers, nbytes)
        entry.keys.append((adapter, 0, key[0]))  # entries sharing no whole block are found by their first token
        entry.keys += [(adapter, j + 1, h) for j, h in enumerate(_chain(key, len(key) // BLOCK))]
        for k in entry.keys:
            self.index.setdefault(k, set()).add(eid)
        self.entries[eid] = entry
        self.by_ids[adapter, key] = eid
        self.tokens += len(key)
        self.nbytes += nbytes
        while self._over():
            self._remove(next(iter(self.entries)))

    def _remove(self, eid: int) -> None:
        entry = self.entries.pop(eid)
        del self.by_ids[entry.adapter, entry.ids]
        for k in entry.keys:
            bucket = self.index[k]
            bucket.discard(eid)
            if not bucket:
                del self.index[k]
        self.tokens -= len(entry.ids)
        self.nbytes -= entry.nbytes

    def get(self, adapter: str | None, prompt: list[int]) -> Hit | None:
        """The longest cached prefix of ``prompt`` (leaving at least one token to run, for the logits)."""
        if not self.enabled or len(prompt) < 2:
            return None
        limit = len(prompt) - 1
        depth, candidates = 0, self.index.get((adapter, 0, prompt[0]))
        if not candidates:
            return None
        for j, h in enumerate(_chain(prompt, limit // BLOCK)):
            deeper = self.index.get((adapter, j + 1, h))
            if not deeper:
                break
            depth, candidates = j + 1, deeper
        start = depth * BLOCK
        best, best_len = None, 0
        for eid in candidates:
            ids = self.entries[eid].ids
            end = min(len(ids), limit)
            n = start
            while n < end and ids[n] == prompt[n]:
                n += 1
            if n > best_len:
                best, best_len = eid, n
        if best is None:
            return None
        if self.entries[best].ids[:start] != tuple(prompt[:start]):  # a hash collision: find it the slow way
            best, best_len = self._scan(adapter, prompt, limit)
            if best is None:
                return None
        entry = self.entries[best]
        self.entries.move_to_end(best)
        self.hits += 1
        self.reused_tokens += best_len
        layers = [(k[:, :, :best_len], v[:, :, :best_len]) for k, v in entry.layers]
        return Hit(best_len, layers)

    def _scan(self, adapter: str | None, prompt: list[int], limit: int) -> tuple[int | None, int]:
        best, best_len, wanted = None, 0, tuple(prompt)
        for eid, entry in self.entries.items():
            length = min(len(entry.ids), limit)
            if entry.adapter == adapter and length > best_len and wanted[:length] == entry.ids[:length]:
                best, best_len = eid, length
        return best, best_len

    def drop_adapter(self, adapter: str) -> None:
        for eid in [eid for eid, e in self.entries.items() if e.adapter == adapter]:
            self._remove(eid)

    def clear(self) -> None:
        self.entries.clear()
        self.by_ids.clear()
        self.index.clear()
        self.tokens = 0
        self.nbytes = 0

    def stats(self) -> dict:
        return {
            "entries": len(self.entries),
            "tokens": self.tokens,
            "bytes": self.nbytes,
            "hits": self.hits,
            "reused_tokens": self.reused_tokens,
            "max_tokens": self.max_tokens,
            "max_bytes": self.max_bytes,
        }
