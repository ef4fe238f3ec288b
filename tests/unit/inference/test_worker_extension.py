"""The vLLM worker extension: streams a safetensors dir into ``model.load_weights``; no torch at import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import shared.vllm_worker_extension as ext


class FakeModel(torch.nn.Module):
    """Stands in for a vLLM model (an ``nn.Module``): records what ``load_weights`` received."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: dict[str, torch.Tensor] = {}

    def load_weights(self, weights):
        for name, tensor in weights:
            self.loaded[name] = tensor
        return set(self.loaded)


class FakeWorker(ext.WeightUpdateExtension):
    """A worker of a vLLM without ``reload_weights`` on its model runner: the model's ``load_weights`` is used."""

    def __init__(self) -> None:
        self.model_runner = type("Runner", (), {"model": FakeModel()})()


class ReloadingRunner:
    """A model runner with vLLM's in-place ``reload_weights`` (checkpoint-format iterator); ``model`` is wrapped
    (as by CUDA graphs), ``get_model()`` gives the bare module."""

    def __init__(self) -> None:
        self.bare = FakeModel()
        self.model = object()  # a wrapper with none of nn.Module's methods
        self.calls: list[bool] = []

    def get_model(self) -> FakeModel:
        return self.bare

    def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        self.calls.append(is_checkpoint_format)
        self.bare.load_weights(weights_iterator)


def test_update_weights_from_path_streams_every_shard(tmp_path):
    save_file({"a.weight": torch.ones(2, 2)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b.weight": torch.zeros(3)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    worker = FakeWorker()
    result = worker.update_weights_from_path(str(tmp_path), version="7")
    assert result == {"weight_version": "7", "tensors": 2, "path": str(tmp_path)}
    assert set(worker.model_runner.model.loaded) == {"a.weight", "b.weight"}
    assert worker.coda_weight_info() == {"weight_version": "7"}


def test_runner_reload_weights_is_preferred(tmp_path):
    """Where vLLM offers the in-place reload (needed where layers were repacked after loading), it is used."""
    save_file({"a.weight": torch.ones(2, 2)}, str(tmp_path / "model.safetensors"))
    worker = FakeWorker()
    worker.model_runner = ReloadingRunner()
    result = worker.update_weights_from_path(str(tmp_path), version="3")
    assert result["tensors"] == 1 and worker.model_runner.calls == [True]
    assert set(worker.model_runner.bare.loaded) == {"a.weight"}


def test_cpu_packed_copies_are_refreshed_after_a_reload(tmp_path, monkeypatch):
    """vLLM's CPU backend keeps a packed copy of the embedding/tied head: it is rebuilt from the new weights.
    (The stale copy was found on vLLM 0.32's CPU build: logits from the old head after a reload.)"""
    import sys
    import types

    calls = []
    fake = types.ModuleType("vllm.model_executor.layers.utils")
    fake.dispatch_cpu_unquantized_gemm = lambda layer, remove_weight: calls.append((layer, remove_weight))
    for name in ("vllm", "vllm.model_executor", "vllm.model_executor.layers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.model_executor.layers.utils", fake)

    head, packed_away, plain = torch.nn.Linear(4, 8), torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    head.cpu_linear = packed_away.cpu_linear = object()
    packed_away.weight = torch.nn.Parameter(torch.empty(0))  # moved into its packed copy at load time
    model = torch.nn.Sequential(head, packed_away, plain)
    model.load_weights = FakeModel().load_weights
    save_file({"0.weight": torch.ones(8, 4)}, str(tmp_path / "model.safetensors"))
    worker = FakeWorker()
    worker.model_runner.model = model
    worker.update_weights_from_path(str(tmp_path))
    assert calls == [(head, False)]
    assert ext._refresh_cpu_packed_weights(torch.nn.Sequential(plain)) == 0  # GPU workers: nothing to do


def test_missing_checkpoint_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        FakeWorker().update_weights_from_path(str(tmp_path))


def test_module_does_not_import_torch_at_top_level():
    tree = ast.parse(Path(ext.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    names = {a.name for n in top for a in n.names} | {n.module for n in top if isinstance(n, ast.ImportFrom)}
    assert not any(str(name).startswith(("torch", "safetensors", "vllm")) for name in names)
