"""Weight changes on the served model: LoRA adapters (vLLM's load/unload semantics) and full-weight reload.

Paths must lie under the configured weights root (a request cannot make the server read arbitrary files).
Reading from disk and validating happen before the engine pauses; the engine thread then only swaps.
A full reload reads every ``*.safetensors`` file of a directory (written atomically by the trainer: a temp
dir renamed into place), checks every name and shape against the model, and only then copies, so a bad
checkpoint changes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from services.inference.model import ModelRunner
from shared.log import get_logger

log = get_logger(__name__)


class WeightsError(ValueError):
    """Bad weights input; the route answers it with a 4xx (``status_code``)."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


def resolve_under(root: Path, path: str, what: str) -> Path:
    """``path`` resolved, refused unless it lies inside ``root`` and exists."""
    resolved = Path(path).expanduser().resolve()
    root = root.expanduser().resolve()
    if resolved != root and root not in resolved.parents:
        raise WeightsError(f"{what} {path!r} is outside the weights root {str(root)!r} configured on this server")
    if not resolved.exists():
        raise WeightsError(f"{what} {path!r} does not exist", 404)
    return resolved


# -- full reload ---------------------------------------------------------------------------------------------
def read_checkpoint(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of the ``*.safetensors`` files in ``directory`` (or the one file ``directory`` names)."""
    files = [directory] if directory.is_file() else sorted(directory.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"no .safetensors files in {str(directory)!r}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return tensors


def check_checkpoint(runner: ModelRunner, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors to copy, by parameter name; raises on unknown names or wrong shapes (nothing copied)."""
    tensors = dict(tensors)
    if runner.tied:
        tensors.pop("lm_head.weight", None)  # tied to the embeddings; HF checkpoints may or may not store it
    unknown = sorted(set(tensors) - set(runner.params))
    if unknown:
        raise WeightsError(f"checkpoint has {len(unknown)} tensors the model does not have, e.g. {unknown[:3]}")
    if not tensors:
        raise WeightsError("checkpoint holds no tensors of this model")
    for name, tensor in tensors.items():
        shape = tuple(runner.params[name].shape)
        if tuple(tensor.shape) != shape:
            raise WeightsError(f"tensor {name} has shape {tuple(tensor.shape)}, the model expects {shape}")
    return tensors


@torch.no_grad()
def apply_checkpoint(runner: ModelRunner, tensors: dict[str, torch.Tensor]) -> int:
    """Copy checked tensors into the live parameters (engine thread, nothing running). Returns the count."""
    for name, tensor in tensors.items():
        runner.params[name].copy_(tensor.to(runner.params[name].dtype))
    return len(tensors)


# -- LoRA ----------------------------------------------------------------------------------------------------
def check_adapter(directory: Path, max_rank: int) -> dict:
    """The adapter's PEFT config, refused if it is not a LoRA adapter or its rank is above ``max_rank``."""
    config_file = directory / "adapter_config.json"
    if not config_file.is_file():
        raise WeightsError(f"{str(directory)!r} has no adapter_config.json: not a PEFT adapter directory")
    config = json.loads(config_file.read_text())
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise WeightsError(f"adapter type {config.get('peft_type')!r} is not supported; only LoRA is")
    rank = int(config.get("r", 0))
    if rank > max_rank:
        raise WeightsError(f"LoRA rank {rank} is greater than max_lora_rank={max_rank}")
    return config


def load_adapter(runner: ModelRunner, name: str, directory: Path, replace: bool = False) -> None:
    """Load an adapter under ``name`` (engine thread, between steps)."""
    from peft import PeftModel

    if name in runner.adapters and replace:
        unload_adapter(runner, name)
    if not runner.has_adapters:
        runner.model = PeftModel.from_pretrained(runner.base, str(directory), adapter_name=name,
                                                 is_trainable=False)
    else:
        runner.model.load_adapter(str(directory), adapter_name=name, is_trainable=False)
    runner.model.eval()
    runner.adapters.add(name)
    log.info("LoRA adapter loaded", extra={"adapter": name, "path": str(directory)})


def unload_adapter(runner: ModelRunner, name: str) -> None:
    """Remove an adapter; with the last one gone the plain base model is served again."""
    if name not in runner.adapters:
        raise WeightsError(f"The lora adapter '{name}' cannot be found.", 404)
    if len(runner.adapters) == 1:
        runner.model.unload()  # removes the LoRA layers, leaving the original modules in place
        runner.model = runner.base
    else:
        runner.model.delete_adapter(name)
    runner.adapters.discard(name)
    log.info("LoRA adapter unloaded", extra={"adapter": name})
