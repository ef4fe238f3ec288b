"""The learning-rate multiplier per optimizer step (what ``LambdaLR`` multiplies ``lr`` by). Pure Python.

warm-up (step < W):    (step + 1) / W
constant:              1
linear / cosine decay: 1 until the decay starts at S, then with progress p = (step − S) / (T − S), clamped
    to [0, 1], T = max_steps:
    linear: m + (1 − m)·(1 − p)        cosine: m + (1 − m)·(1 + cos(π·p)) / 2
with m = ``min_ratio`` and S = W, or S = max(W, T − D) when the decay spans only the last D steps
(``decay_steps``; warm-up, stable, decay). Without a step budget (T = 0, train forever) a decay has nothing
to end at, so the multiplier stays 1 after the warm-up.
"""

from __future__ import annotations

import math
from typing import Literal

Schedule = Literal["constant", "linear", "cosine"]


def lr_multiplier(
    step: int,
    *,
    warmup: int = 0,
    total: int = 0,
    schedule: Schedule = "constant",
    min_ratio: float = 0.0,
    decay_steps: int = 0,
) -> float:
    if warmup and step < warmup:
        return (step + 1) / warmup
    start = max(warmup, total - decay_steps) if decay_steps else warmup
    if schedule == "constant" or total <= start:
        return 1.0
    p = min(1.0, max(0.0, (step - start) / (total - start)))
    if schedule == "linear":
        return min_ratio + (1.0 - min_ratio) * (1.0 - p)
    if schedule == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"unknown learning-rate schedule {schedule!r}")
