"""vLLM itself as the policy server: ``deploy/vllm/serve.sh`` (the production flags: LoRA, dev-mode reload
routes, our worker extension) with the environment that points it at a model, a port and a vLLM install."""

from __future__ import annotations

import os
from pathlib import Path

SERVE_SCRIPT = Path(__file__).resolve().parents[1] / "deploy" / "vllm" / "serve.sh"
# float32: the trainer computes in float32, so the sync check and the IS ratios compare like with like.
SERVE_COMMAND = ["sh", str(SERVE_SCRIPT), "--dtype", "float32"]


def serve_env(bin_dir: Path, model: Path, port: int, max_model_len: int) -> dict[str, str]:
    """What ``SERVE_COMMAND`` needs on top of the caller's environment (``bin_dir`` holds ``vllm``)."""
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        # The CPU build does not announce itself; a CUDA vLLM is used with VLLM_TARGET_DEVICE=cuda.
        "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cpu"),
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "MODEL": str(Path(model).resolve()),
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "MAX_MODEL_LEN": str(max_model_len),
    }
