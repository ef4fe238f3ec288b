"""The KV batch is written from two modes: prefill joins rows on the engine thread with plain grad-off tensors,
decode grows and writes the buffers inside ``torch.inference_mode``. Every mix of the two, on any thread,
must work: an in-place write to a buffer created in inference mode, done outside it, is a RuntimeError."""

from __future__ import annotations

import threading

import torch

from services.inference.kv import KVBatch


def layer(rows: int, length: int, fill: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    t = torch.full((rows, 1, length, 2), fill)
    return [(t, -t)]


def test_longer_rows_join_after_the_buffers_grew_in_inference_mode():
    kv = KVBatch(1)
    kv.add_rows(layer(1, 3, 1.0))
    with torch.inference_mode():  # ModelRunner.decode's growth at the second step (capacity 4 → 64)
        kv.ensure_capacity(kv.length + 2)
    kv.add_rows(layer(1, 6, 2.0))  # shifts the old row right, in place
    assert kv.pad == [3, 0] and kv.keys[0][0, 0, :6, 0].tolist() == [0, 0, 0, 1, 1, 1]


def test_rows_joined_inside_inference_mode_shift_outside_it():
    kv = KVBatch(1)
    with torch.inference_mode():
        kv.add_rows(layer(1, 2, 1.0))
    kv.add_rows(layer(1, 5, 2.0))
    with torch.inference_mode():
        kv.add_rows(layer(1, 7, 3.0))
    kv.keep_rows([0, 2])
    kv.add_rows(layer(1, 9, 4.0))
    assert kv.pad == [7, 2, 0] and kv.values[0][0, 0, :9, 0].tolist() == [0] * 7 + [-1, -1]


def test_another_thread_can_join_rows_after_inference_mode_growth():
    """Inference mode is per thread: a buffer grown in one thread's inference mode is written by another."""
    kv = KVBatch(1)
    kv.add_rows(layer(2, 3, 1.0))
    with torch.inference_mode():
        kv.ensure_capacity(80)
    errors: list[BaseException] = []

    def join() -> None:
        try:
            kv.add_rows(layer(1, 9, 4.0))
        except BaseException as exc:  # reported to the test thread below
            errors.append(exc)

    thread = threading.Thread(target=join)
    thread.start()
    thread.join()
    assert errors == [] and kv.pad == [6, 6, 0]


def test_the_cache_layer_writes_into_buffers_made_outside_inference_mode():
    kv = KVBatch(1)
    kv.add_rows(layer(1, 3, 1.0))
    kv.ensure_capacity(kv.length + 1)
    with torch.inference_mode():
        new = torch.full((1, 1, 1, 2), 9.0)
        kv.as_cache().layers[0].update(new, -new)
    kv.length += 1
    kv.add_rows(layer(1, 6, 2.0))
    assert kv.keys[0][0, 0, :6, 0].tolist() == [0, 0, 1, 1, 1, 9]
