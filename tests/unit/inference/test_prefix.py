"""The prefix cache's bookkeeping: longest prefix, one token always left to run, LRU bound, invalidation."""

from __future__ import annotations

import torch

from services.inference.prefix import PrefixCache


def kv(length: int, fill: float = 1.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    t = torch.arange(length, dtype=torch.float32).view(1, 1, length, 1) + fill
    return [(t, -t)]


def test_longest_prefix_wins_and_one_token_is_left():
    cache = PrefixCache(100)
    cache.put(None, [1, 2], kv(2))
    cache.put(None, [1, 2, 3, 4], kv(4))
    hit = cache.get(None, [1, 2, 3, 4, 5])
    assert hit.length == 4 and hit.layers[0][0].shape[2] == 4
    same = cache.get(None, [1, 2, 3, 4])  # the whole prompt is cached: reuse all but its last token
    assert same.length == 3 and same.layers[0][0][0, 0, :, 0].tolist() == [1, 2, 3]
    assert cache.get(None, [9, 1, 2]) is None and cache.get(None, [1]) is None


def test_adapters_are_separate_and_can_be_dropped():
    cache = PrefixCache(100)
    cache.put("a", [1, 2, 3], kv(3))
    assert cache.get(None, [1, 2, 3, 4]) is None and cache.get("a", [1, 2, 3, 4]).length == 3
    cache.drop_adapter("a")
    assert cache.get("a", [1, 2, 3, 4]) is None and cache.tokens == 0


def test_least_recently_used_goes_first_and_clear_empties():
    cache = PrefixCache(6)
    cache.put(None, [1, 2, 3], kv(3))
    cache.put(None, [4, 5, 6], kv(3))
    cache.get(None, [1, 2, 3, 9])  # touch the first entry
    cache.put(None, [7, 8], kv(2))  # over budget: [4, 5, 6] is the least recently used
    assert cache.get(None, [4, 5, 6, 9]) is None and cache.get(None, [1, 2, 3, 9]) is not None
    cache.clear()
    assert cache.tokens == 0 and cache.get(None, [1, 2, 3, 9]) is None


def test_disabled_cache_keeps_nothing():
    cache = PrefixCache(0)
    cache.put(None, [1, 2, 3], kv(3))
    assert not cache.entries and cache.get(None, [1, 2, 3, 4]) is None
