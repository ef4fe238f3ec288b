"""The vLLM worker extension: streams a safetensors dir into ``model.load_weights``; no torch at import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import shared.vllm_worker_extension as ext


class FakeModel:
    """Stands in for a vLLM model: records what ``load_weights`` received (vLLM itself cannot run here)."""

    def __init__(self) -> None:
        self.loaded: dict[str, torch.Tensor] = {}

    def load_weights(self, weights):
        for name, tensor in weights:
            self.loaded[name] = tensor
        return set(self.loaded)


class FakeWorker(ext.WeightUpdateExtension):
    def __init__(self) -> None:
        self.model_runner = type("Runner", (), {"model": FakeModel()})()


def test_update_weights_from_path_streams_every_shard(tmp_path):
    save_file({"a.weight": torch.ones(2, 2)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b.weight": torch.zeros(3)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    worker = FakeWorker()
    result = worker.update_weights_from_path(str(tmp_path), version="7")
    assert result == {"weight_version": "7", "tensors": 2, "path": str(tmp_path)}
    assert set(worker.model_runner.model.loaded) == {"a.weight", "b.weight"}
    assert worker.coda_weight_info() == {"weight_version": "7"}


def test_missing_checkpoint_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        FakeWorker().update_weights_from_path(str(tmp_path))


def test_module_does_not_import_torch_at_top_level():
    tree = ast.parse(Path(ext.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    names = {a.name for n in top for a in n.names} | {n.module for n in top if isinstance(n, ast.ImportFrom)}
    assert not any(str(name).startswith(("torch", "safetensors", "vllm")) for name in names)
