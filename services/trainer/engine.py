"""The model in a DeepSpeed engine: process group, policy (full or LoRA), fixed reference, optimizer.

On CPU DeepSpeed talks gloo and must not JIT-compile anything: the shared-memory comm op build (g++, one to
two minutes on two cores) is switched off before init by replacing ``build_shm_op``, and the optimizer is a
torch ``AdamW`` instance (a DeepSpeed optimizer block would compile ``fused_adam``). A lone process gets the
``RANK``/``WORLD_SIZE``/``MASTER_*`` variables torchrun would set, so DeepSpeed never tries MPI discovery.
Several ranks (one host or several, see docs/scaling-out.md, "The trainer across hosts") wait for each other up to the
timeout given here while starting; the loop then bounds collectives tighter (``services.trainer.batches``).
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
from torch import nn

from services.trainer.config import TrainerSettings
from services.trainer.logprobs import PolicyLogprobs
from services.trainer.step import lr_multiplier
from shared.log import get_logger
from shared.precision import compute_dtype
from shared.redis_server import free_port

log = get_logger(__name__)


def init_distributed(timeout_s: float | None = None) -> torch.device:
    """Join (or create) the process group, whose collectives wait at most ``timeout_s`` (None: DeepSpeed's
    default, 10 minutes); returns this rank's device."""
    if "RANK" not in os.environ:  # a lone process, not launched by torchrun/deepspeed
        os.environ.update(
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=os.environ.get("MASTER_PORT", str(free_port())),
        )
    import deepspeed
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-publish "Writing model shards" bars would flood the log
    # `import deepspeed.comm.torch as m` would bind the torch package itself (a name in deepspeed.comm
    # shadows the submodule); importlib returns the real submodule.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    cuda = torch.cuda.is_available()
    if not torch.distributed.is_initialized():
        kwargs = {} if timeout_s is None else {"timeout": timedelta(seconds=timeout_s)}
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", **kwargs)
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def param_dtype(settings: TrainerSettings, device: torch.device) -> torch.dtype:
    """The weights' dtype: bf16 on a GPU that computes in bf16; fp32 on CPU, where bf16 is autocast instead
    (fp32 weights keep the optimizer exact; DeepSpeed's bf16 mode targets GPUs)."""
    dtype = compute_dtype(settings.precision, device.type)
    return dtype if device.type == "cuda" else torch.float32


def autocast_dtype(settings: TrainerSettings, device: torch.device) -> torch.dtype | None:
    """bf16 for the decoder's autocast on CPU when the precision says bf16; None: no autocast."""
    if device.type == "cuda":
        return None
    dtype = compute_dtype(settings.precision, device.type)
    return dtype if dtype != torch.float32 else None


def load_lm(path: str, settings: TrainerSettings, dtype: torch.dtype) -> nn.Module:
    """The Hugging Face causal LM at ``path``, with LoRA and gradient checkpointing as configured."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    lm.config.use_cache = False
    if settings.gradient_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if settings.finetune == "lora":
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(
            r=settings.lora.rank,
            lora_alpha=settings.lora.alpha,
            lora_dropout=settings.lora.dropout,
            target_modules=list(settings.lora.targets),
            task_type="CAUSAL_LM",
            layers_to_transform=_top_layers(lm, settings.lora.layers),
        )
        lm = get_peft_model(lm, cfg)
        if settings.lora.layers:
            _no_input_grads(lm.get_base_model())
    return lm


def _no_input_grads(lm: nn.Module) -> None:
    """Undo ``enable_input_require_grads``, which transformers (checkpointing) and peft each apply, the second
    time over the first one's record so ``disable_input_require_grads`` misses it. It serves reentrant
    checkpointing, which we do not use; kept, backward runs through every frozen layer below the adapters."""
    hooks = lm.get_input_embeddings()._forward_hooks
    for key in [k for k, fn in hooks.items() if getattr(fn, "__name__", "") == "make_inputs_require_grads"]:
        del hooks[key]


def _top_layers(lm: nn.Module, n: int) -> list[int] | None:
    """Indices of the top ``n`` decoder layers (None: all of them)."""
    if not n:
        return None
    total = lm.config.num_hidden_layers
    if n > total:
        raise ValueError(f"[trainer.lora] layers={n} but the model has {total} decoder layers")
    return list(range(total - n, total))


def load_reference(settings: TrainerSettings, device: torch.device, dtype: torch.dtype) -> PolicyLogprobs | None:
    """The fixed KL reference: always the configured initial weights, never a resumed checkpoint."""
    if settings.kl_coef == 0:
        return None
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(
        settings.reference_model or settings.model, dtype=dtype, attn_implementation="sdpa"
    )
    lm.requires_grad_(False)
    return (
        PolicyLogprobs(lm, settings.logprob_chunk, settings.temperature, autocast_dtype(settings, device))
        .to(device)
        .eval()
    )


def ds_config(settings: TrainerSettings, dtype: torch.dtype) -> dict:
    return {
        # Micro-batches are token-budgeted and counted by us: one "micro-batch" per backward, the step
        # boundary set explicitly (engine.set_gradient_accumulation_boundary).
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": settings.grad_clip,
        "zero_optimization": {"stage": settings.zero_stage},
        "bf16": {"enabled": dtype == torch.bfloat16},
        "fp16": {"enabled": False},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


@dataclass
class Engine:
    """The DeepSpeed engine around ``PolicyLogprobs`` plus what the loop needs next to it."""

    engine: object  # deepspeed.DeepSpeedEngine
    policy: PolicyLogprobs  # engine.module
    device: torch.device
    rank: int
    world: int

    @property
    def lm(self) -> nn.Module:
        return self.policy.lm


def build_engine(settings: TrainerSettings, device: torch.device) -> Engine:
    import deepspeed

    dtype = param_dtype(settings, device)
    policy = PolicyLogprobs(
        load_lm(settings.model, settings, dtype),
        settings.logprob_chunk,
        settings.temperature,
        autocast_dtype(settings, device),
    )
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=settings.lr, betas=tuple(settings.betas), weight_decay=settings.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        functools.partial(
            lr_multiplier,
            warmup=settings.warmup_steps,
            total=settings.max_steps,
            schedule=settings.lr_schedule,
            min_ratio=settings.lr_min_ratio,
            decay_steps=settings.lr_decay_steps,
        ),
    )
    engine, _, _, _ = deepspeed.initialize(
        model=policy,
        model_parameters=params,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        config=ds_config(settings, dtype),
    )
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    log.info(
        "engine ready",
        extra={
            "zero_stage": settings.zero_stage,
            "finetune": settings.finetune,
            "trainable": sum(p.numel() for p in params),
            "world": world,
            "device": str(device),
            "dtype": str(dtype),
            "autocast": str(policy.autocast),
        },
    )
    return Engine(engine=engine, policy=engine.module, device=device, rank=rank, world=world)
