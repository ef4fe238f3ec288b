"""Weight changes on the served model: LoRA adapters (vLLM's load/unload semantics) and full-weight reload.

Paths must lie under the configured weights root (a request cannot make the server read arbitrary files).
Reading from disk and validating happen before the engine pauses; the engine thread then only swaps.
A full reload reads every ``*.safetensors`` file of a directory (written atomically by the trainer: a temp
dir renamed into place), checks every name, shape and value (NaN/Inf: a model that answers 500 or empty text
while /health says ok) against the model, and only then copies, so a bad checkpoint changes nothing. An
adapter's config and weights get the same checks before peft touches the model, and a load that still fails
is undone, so the adapters served before stay as they were.

Every change first unmerges a merged adapter (``ModelRunner.unmerge``): a full reload copies into the base
parameters, which must not hold a delta then, and peft may neither delete a merged adapter nor leave a new one's
layers consistent with a merge made before it came.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import SafetensorError
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
    """``path`` resolved, refused unless it lies inside ``root`` and exists.

    A path the operating system cannot look up (a NUL byte, a component over NAME_MAX, ``~user`` of no user)
    is a 400 that says so, not an exception out of the route (each was a 500)."""
    if "\x00" in path:
        raise WeightsError(f"{what} {path[:200]!r} holds a NUL byte, which no file path can")
    root = root.expanduser().resolve()
    try:
        resolved = Path(path).expanduser().resolve()
        inside = resolved == root or root in resolved.parents
        exists = inside and resolved.exists()
    except (OSError, RuntimeError) as exc:
        reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        raise WeightsError(f"{what} {path[:200]!r} is not a usable path: {reason}") from None
    if not inside:
        raise WeightsError(f"{what} {path!r} is outside the weights root {str(root)!r} configured on this server")
    if not exists:
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
        tensors.update(_load_safetensors(file))
    return tensors


def _load_safetensors(file: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:  # truncated, not safetensors, unreadable
        raise WeightsError(f"could not read {str(file)!r} (truncated or not a safetensors file?): {exc}") from None


def _check_finite(name: str, tensor: torch.Tensor) -> None:
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise WeightsError(f"tensor {name} has {bad} non-finite values (NaN or Inf); weights not loaded")


def check_checkpoint(runner: ModelRunner, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors to copy, by parameter name, in the model's dtype; raises on unknown names, wrong shapes and
    non-finite values (nothing copied). Checked after the cast: a float32 1e39 is Inf in float16."""
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
        tensors[name] = tensor = tensor.to(runner.params[name].dtype)
        _check_finite(name, tensor)
    return tensors


@torch.no_grad()
def apply_checkpoint(runner: ModelRunner, tensors: dict[str, torch.Tensor]) -> int:
    """Copy checked tensors into the live parameters (engine thread, nothing running). Returns the count."""
    runner.unmerge()
    for name, tensor in tensors.items():
        runner.params[name].copy_(tensor)
    return len(tensors)


# -- LoRA ----------------------------------------------------------------------------------------------------
def check_adapter(directory: Path, max_rank: int) -> dict:
    """The adapter's PEFT config, refused unless it is a LoRA config of rank at most ``max_rank`` whose weights
    read completely, have that rank and hold finite values (peft loads garbage into the model otherwise)."""
    config_file = directory / "adapter_config.json"
    if not config_file.is_file():
        raise WeightsError(f"{str(directory)!r} has no adapter_config.json: not a PEFT adapter directory")
    try:
        config = json.loads(config_file.read_text())
    except (ValueError, OSError) as exc:
        raise WeightsError(f"adapter_config.json in {str(directory)!r} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise WeightsError(f"adapter_config.json in {str(directory)!r} is not a JSON object")
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise WeightsError(f"adapter type {config.get('peft_type')!r} is not supported; only LoRA is")
    rank, alpha = config.get("r", 8), config.get("lora_alpha", 8)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise WeightsError(f"adapter_config.json: r must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise WeightsError(f"LoRA rank {rank} is greater than max_lora_rank={max_rank}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise WeightsError(f"adapter_config.json: lora_alpha must be a finite number, got {alpha!r}")
    _check_adapter_weights(directory, rank if not config.get("rank_pattern") else None, max_rank)
    return config


def _check_adapter_weights(directory: Path, rank: int | None, max_rank: int) -> None:
    """Every tensor finite; every ``lora_A`` of rank ``rank`` (None: per-module ranks) and ≤ ``max_rank``."""
    file = directory / "adapter_model.safetensors"
    if file.is_file():
        tensors = _load_safetensors(file)
    elif (directory / "adapter_model.bin").is_file():
        try:
            tensors = torch.load(directory / "adapter_model.bin", map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many kinds for a corrupt pickle
            raise WeightsError(f"could not read adapter_model.bin in {str(directory)!r}: {exc}") from None
    else:
        raise WeightsError(f"{str(directory)!r} has no adapter_model.safetensors (or .bin)")
    if not tensors:
        raise WeightsError(f"the adapter in {str(directory)!r} holds no tensors")
    for name, tensor in tensors.items():
        _check_finite(name, tensor)
        if "lora_A" in name and tensor.dim() == 2:
            found = tensor.shape[0]
            if found > max_rank or (rank is not None and found != rank):
                raise WeightsError(
                    f"tensor {name} has rank {found}; adapter_config.json says r={rank} (max_lora_rank={max_rank})"
                )


def load_adapter(runner: ModelRunner, name: str, directory: Path, replace: bool = False) -> None:
    """Load an adapter under ``name`` (engine thread, between steps); if peft fails half-way, undo it."""
    from peft import PeftModel

    runner.unmerge()
    if name in runner.adapters and replace:
        unload_adapter(runner, name)
    first = not runner.has_adapters
    try:
        # autocast_adapter_dtype=False: peft would upcast a bf16 adapter to fp32, computing LoRA in another
        # precision than the trainer that saved it (measured on a GPU: sync check 1e-2 instead of 2e-6).
        if first:
            runner.model = PeftModel.from_pretrained(
                runner.base, str(directory), adapter_name=name, is_trainable=False, autocast_adapter_dtype=False
            )
        else:
            runner.model.load_adapter(
                str(directory), adapter_name=name, is_trainable=False, autocast_adapter_dtype=False
            )
    except Exception:
        if first:
            runner.model = runner.base
            _strip_adapter_layers(runner.base)
        elif name in runner.model.peft_config:
            runner.model.delete_adapter(name)
        raise
    runner.model.eval()
    runner.adapters.add(name)
    log.info("LoRA adapter loaded", extra={"adapter": name, "path": str(directory)})


def _strip_adapter_layers(model: torch.nn.Module) -> None:
    """Put back the original modules where a failed first load left peft's LoRA wrappers in the base model."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    wrapped = [(key, m) for key, m in model.named_modules() if isinstance(m, BaseTunerLayer)]
    outer = [(key, m) for key, m in wrapped if not any(key.startswith(f"{other}.") for other, _ in wrapped)]
    for key, module in outer:
        parent_key, _, child = key.rpartition(".")
        setattr(model.get_submodule(parent_key) if parent_key else model, child, module.get_base_layer())
    if hasattr(model, "peft_config"):
        del model.peft_config
    if outer:
        log.warning("undid a failed LoRA load", extra={"modules": len(outer)})


def unload_adapter(runner: ModelRunner, name: str) -> None:
    """Remove an adapter; with the last one gone the plain base model is served again."""
    if name not in runner.adapters:
        raise WeightsError(f"The lora adapter '{name}' cannot be found.", 404)
    runner.unmerge()
    runner.unmergeable.discard(name)
    if len(runner.adapters) == 1:
        runner.model.unload()  # removes the LoRA layers, leaving the original modules in place
        runner.model = runner.base
    else:
        if runner.model.active_adapter == name:  # a merge made it active: pick the next one (peft would warn)
            runner.model.set_adapter(min(runner.adapters - {name}), inference_mode=True)
        runner.model.delete_adapter(name)
    runner.adapters.discard(name)
    log.info("LoRA adapter unloaded", extra={"adapter": name})
