"""The precision every test computes in: fp32, whatever the CPU.

On a CPU with AVX512-BF16, precision ``auto`` means bf16 autocast (shared.precision), and the 1e-4 contracts
between the inference server, the trainer and plain transformers in fp32 would measure bf16's rounding (0.002 to
0.004 in a logprob) instead of a bug. tests/conftest.py puts these in the environment before any settings class
reads it; a harness that starts services with a cleaned environment passes them on. A test of the bf16 path
names ``precision="bf16"``.
"""

from __future__ import annotations

FP32_ENV = {"CODA_INFERENCE_PRECISION": "fp32", "CODA_TRAINER_PRECISION": "fp32"}
