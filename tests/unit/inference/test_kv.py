"""The right-aligned batched KV cache: rows of different lengths, joins, removals, in-place appends."""

from __future__ import annotations

import torch

from services.inference.kv import KVBatch


def layer(rows: int, length: int, fill: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    t = torch.full((rows, 1, length, 2), fill)
    return [(t, -t)]


def test_rows_are_right_aligned_with_left_padding():
    kv = KVBatch(1)
    kv.add_rows(layer(1, 3, 1.0))
    kv.add_rows(layer(2, 5, 2.0))
    assert kv.pad == [2, 0, 0] and kv.length == 5 and kv.real_lengths() == [3, 5, 5]
    assert kv.keys[0][0, 0, :5, 0].tolist() == [0, 0, 1, 1, 1]
    assert kv.values[0][1, 0, :5, 0].tolist() == [-2] * 5
    assert kv.attention_mask(1).tolist()[0] == [0, 0, 1, 1, 1, 1]


def test_shorter_join_pads_the_new_rows():
    kv = KVBatch(1)
    kv.add_rows(layer(1, 4, 1.0))
    kv.add_rows(layer(1, 2, 3.0))
    assert kv.pad == [0, 2] and kv.keys[0][1, 0, :4, 0].tolist() == [0, 0, 3, 3]


def test_keep_rows_trims_shared_padding():
    kv = KVBatch(1)
    kv.add_rows(layer(1, 2, 1.0))
    kv.add_rows(layer(1, 5, 2.0))
    kv.keep_rows([0])
    assert kv.pad == [0] and kv.length == 2 and kv.keys[0][0, 0, :2, 0].tolist() == [1, 1]
    kv.keep_rows([])
    assert kv.rows == 0 and kv.length == 0


def test_cache_layer_writes_the_new_column_in_place():
    kv = KVBatch(1)
    kv.add_rows(layer(2, 3, 1.0))
    kv.ensure_capacity(kv.length + 1)
    cache = kv.as_cache()
    new = torch.full((2, 1, 1, 2), 9.0)
    keys, _ = cache.layers[0].update(new, -new)
    assert keys.shape[2] == 4 and keys[0, 0, 3, 0] == 9.0 and cache.get_seq_length() == 3
    kv.length += 1
    assert kv.keys[0][1, 0, :4, 0].tolist() == [1, 1, 1, 9]


def test_capacity_grows_without_losing_data():
    kv = KVBatch(1)
    kv.add_rows(layer(1, 3, 1.0))
    kv.ensure_capacity(500)
    assert kv.keys[0].shape[2] >= 500 and kv.keys[0][0, 0, :3, 0].tolist() == [1, 1, 1]
