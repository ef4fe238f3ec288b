"""The vLLM worker extension that gives a stock ``vllm serve`` our full-weight reload.

vLLM mixes this class into every GPU worker when started with
``--worker-extension-cls shared.vllm_worker_extension.WeightUpdateExtension`` (``shared/`` on the
PYTHONPATH of the vLLM container). With ``VLLM_SERVER_DEV_MODE=1`` the trainer then calls

    POST /collective_rpc {"method": "update_weights_from_path", "args": ["/weights/full/v7"],
                          "kwargs": {"version": "7"}}

and each worker streams the safetensors files of that directory into its model shard. Where the model runner
has ``reload_weights`` (vLLM's in-place reload, 0.2x and later) that is used: it restores each layer's
checkpoint layout, loads through the model's own ``load_weights`` (which knows vLLM's fused/sharded parameter
layout) and re-runs the post-load processing. Plain ``model.load_weights`` alone is not enough there: layers
whose weights were repacked after loading (vLLM's CPU backend packs every linear layer for oneDNN and leaves an
empty ``weight``) cannot take a checkpoint tensor again. Older vLLM without ``reload_weights`` gets the plain
``model.load_weights``. Our CPU server implements the same method natively (``services/inference``), so the
trainer's code is the same for both.

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


def _refresh_cpu_packed_weights(model: Any) -> int:
    """Re-pack the CPU GEMM copies of layers that keep their ``weight`` (embeddings and the output head).

    vLLM's CPU backend gives such a layer a packed copy of its weight for the matrix product (``cpu_linear``),
    made once after loading. A tied output head shares the embedding's tensor but is not re-processed by the
    in-place reload (the checkpoint has no tensor under its name), so after a reload the logits came from the
    old head while the rest of the model was new: measured on vLLM 0.32 (CPU) as a 5.7 nat logprob error that
    this refresh brings back to 2e-6. Layers whose weight was moved into the packed copy (empty ``weight``)
    are re-packed by the reload itself. No-op on GPUs, where no layer has ``cpu_linear``. Returns the count.
    """
    layers = [
        m
        for m in model.modules()
        if hasattr(m, "cpu_linear") and getattr(getattr(m, "weight", None), "ndim", 0) == 2 and m.weight.numel() > 0
    ]
    if layers:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        for layer in layers:
            dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    return len(layers)


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

        runner = self.model_runner
        # get_model(): the bare model, also where CUDA graphs wrap runner.model.
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        if hasattr(runner, "reload_weights"):
            runner.reload_weights(weights_iterator=counted(), is_checkpoint_format=True)
        else:
            model.load_weights(weights=counted())
        _refresh_cpu_packed_weights(model)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.coda_weight_version = version
        return {"weight_version": version, "tensors": count, "path": str(path)}

    def coda_weight_info(self) -> dict[str, Any]:
        """What ``update_weights_from_path`` last loaded (``POST /collective_rpc {"method": "coda_weight_info"}``)."""
        return {"weight_version": getattr(self, "coda_weight_version", None)}
