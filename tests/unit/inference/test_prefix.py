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


def test_bytes_bound_evicts_and_is_counted():
    one = 2 * 3 * 4  # kv(3): keys and values of 3 fp32 values
    cache = PrefixCache(max_bytes=2 * one)
    cache.put(None, [1, 2, 3], kv(3))
    cache.put(None, [4, 5, 6], kv(3))
    assert cache.nbytes == 2 * one
    cache.put(None, [7, 8, 9], kv(3))
    assert cache.nbytes == 2 * one and cache.get(None, [1, 2, 3, 0]) is None
    cache.put(None, list(range(100)), kv(100))  # larger than the whole budget: not kept
    assert cache.nbytes == 2 * one
    cache.drop_adapter("x")
    cache.clear()
    assert cache.nbytes == 0 and not cache.index
    assert not PrefixCache(max_tokens=None, max_bytes=0).enabled


def test_long_prompts_match_across_blocks_and_partially():
    from services.inference.prefix import BLOCK

    cache = PrefixCache(max_bytes=10**6)
    base = list(range(100, 100 + 3 * BLOCK + 5))
    cache.put(None, base, kv(len(base)))
    hit = cache.get(None, [*base, 1, 2])
    assert hit.length == len(base)
    # diverges mid-block: the common part is reused
    other = base[: 2 * BLOCK + 3] + [7] * 20
    assert cache.get(None, other).length == 2 * BLOCK + 3
    # diverges inside the first block
    assert cache.get(None, base[:5] + [7] * 40).length == 5
    assert cache.get("a", [*base, 1]) is None and cache.get(None, [9, *base]) is None
    cache.drop_adapter("a")
    assert cache.get(None, [*base, 1]).length == len(base)


def test_hash_collisions_fall_back_to_a_scan(monkeypatch):
    from services.inference import prefix

    monkeypatch.setattr(prefix, "_chain", lambda ids, blocks: [0] * blocks)  # every block collides
    cache = PrefixCache(max_bytes=10**6)
    a, b = [1] * 40, [1] * 20 + [2] * 20
    cache.put(None, a, kv(40))
    cache.put(None, b, kv(40))
    assert cache.get(None, [*b, 3]).length == 40
    assert cache.get(None, [*a, 3]).length == 40
