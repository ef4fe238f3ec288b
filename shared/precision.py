"""Which precision a model computes in: one rule for the trainer, the inference server and the retriever.

bf16 pays only where the hardware multiplies it natively: a CUDA GPU, or a CPU with AVX512-BF16 or AMX.
Elsewhere torch emulates it: measured on an AVX2-only CPU (AMD EPYC), a [1024×576]·[576×1536] matmul ran at
7.3 GFLOP/s in bf16 against 47.6 in fp32 — 6.5× slower. So ``auto`` means bf16 there and fp32 elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # torch is imported where a dtype is asked for: the retriever may run without it
    import torch

Precision = Literal["auto", "fp32", "bf16"]


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX): only then is bf16 faster than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when torch sees a GPU, else ``cpu``; any other name as it is."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def compute_dtype(precision: Precision, device_type: str) -> torch.dtype:
    """The dtype matmuls run in for ``precision`` on a ``device_type`` ("cpu" / "cuda") device."""
    import torch

    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp32":
        return torch.float32
    if device_type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if native_bf16() else torch.float32
