"""The vLLM worker extension that gives a stock ``vllm serve`` our full-weight reload.

vLLM mixes this class into every GPU worker when started with
``--worker-extension-cls shared.vllm_worker_extension.WeightUpdateExtension`` (``shared/`` on the
PYTHONPATH of the vLLM container). With ``VLLM_SERVER_DEV_MODE=1`` the trainer then calls

    POST /collective_rpc {"method": "update_weights_from_path", "args": ["/weights/full/v7"],
                          "kwargs": {"version": "7"}}

and each worker streams the safetensors files of that directory into its model shard through the model's own
``load_weights`` (which knows vLLM's fused/sharded parameter layout). Our CPU server implements the same
method natively (``services/inference``), so the trainer's code is the same for both.

The directory must be complete when the call arrives: the trainer writes to a temp dir and renames it
(atomic on one filesystem). vLLM passes only strings through ``/collective_rpc``, hence ``version: str``.
torch and safetensors are imported inside the methods: ``shared/`` must stay importable without them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any


def safetensors_files(path: str | Path) -> list[Path]:
    """The checkpoint files of ``path`` (a directory of ``*.safetensors``, or one file), sorted."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files at {path}")
    return files


def iter_tensors(files: list[Path]) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` pairs, one file at a time (never the whole checkpoint in memory at once)."""
    from safetensors import safe_open

    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield name, handle.get_tensor(name)


class WeightUpdateExtension:
    """Methods vLLM adds to its workers; ``self.model_runner`` is the worker's model runner."""

    def update_weights_from_path(self, path: str, version: str | None = None) -> dict[str, Any]:
        import torch

        files = safetensors_files(path)
        count = 0

        def counted() -> Iterator[tuple[str, Any]]:
            nonlocal count
            for item in iter_tensors(files):
                count += 1
                yield item

        self.model_runner.model.load_weights(weights=counted())
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.coda_weight_version = version
        return {"weight_version": version, "tensors": count, "path": str(path)}

    def coda_weight_info(self) -> dict[str, Any]:
        """What ``update_weights_from_path`` last loaded (``POST /collective_rpc {"method": "coda_weight_info"}``)."""
        return {"weight_version": getattr(self, "coda_weight_version", None)}
