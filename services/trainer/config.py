"""Trainer settings: one pydantic-settings class (env prefix ``CODA_TRAINER_``, recipe table ``[trainer]``).

The settings of one part are a nested table of their own, a model the part reads whole: ``[trainer.lora]``
(``LoraSettings``), ``[trainer.importance]`` (``ImportanceSampling``), ``[trainer.red]``
(``services.trainer.rl.red.REDConfig``), ``[trainer.sync]`` (``SyncCheck``) and ``[trainer.wandb]``
(``WandbSettings``); env ``CODA_TRAINER_LORA__RANK``, flag ``--lora JSON``. Their flat spellings of the release
before (``[trainer] lora_rank``, ``CODA_TRAINER_LORA_RANK``, ``--lora-rank``) still set them, with a warning
naming the new key (``MOVED``); so does ``served_model`` (``CODA_TRAINER_SERVED_MODEL``), now
``served_model_name`` as everywhere else. They go in the next release.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.trainer.rl.red import REDConfig
from shared.contract import contract_field, contract_names
from shared.precision import Precision
from shared.settings import ServiceSettings, service_config


class LoraSettings(BaseModel):
    """The LoRA adapter that finetune = "lora" trains (peft)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(16, ge=1, description="LoRA rank r")
    alpha: int = Field(32, ge=1, description="LoRA alpha")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout")
    targets: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj"], description="Module names that get LoRA adapters"
    )
    layers: int = Field(
        0,
        ge=0,
        description="LoRA on the top N decoder layers only (0: every layer). Backward then stops at the lowest "
        "adapted layer and the layers below keep no activations: less time and memory a step, fewer weights to learn "
        "(smol-2wiki, top 10 of 30: trainer compute 2.6x faster, held-out F1 0.181 against 0.293; "
        "bench/results/qa-rlstep-top10.md)",
    )


class ImportanceSampling(BaseModel):
    """Importance sampling against the sampler's logprobs μ (services/trainer/step.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["none", "token", "sequence", "token+sequence"] = Field(
        "none", description="none: PPO ratio against the sampler (bypass); else IS weights π/μ (decoupled)"
    )
    cap: float = Field(2.0, gt=0, description="Token-level truncated importance weight cap")
    seq_min: float = Field(0.5, gt=0, description="Lower edge of the sequence ratio band (geometric mean)")
    seq_max: float = Field(2.0, gt=0, description="Upper edge of the sequence ratio band (geometric mean)")


class SyncCheck(BaseModel):
    """The sync check: after a publish, the server's logprobs of a probe against the trainer's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    check: bool = Field(False, description="After each publish, compare server and trainer logprobs")
    wait_s: float = Field(
        60.0,
        gt=0,
        description="How long the sync check waits for the rollout to load a published version into the "
        "server before it is skipped with a warning",
    )
    prompt: list[int] | None = Field(
        None,
        description="Probe prompt token ids of the sync check (default: a fixed question through the model's chat "
        "template; a prompt of special-token ids made fp32 kernel noise alone exceed 1e-4 on vLLM's CPU build)",
    )
    tokens: int = Field(16, ge=1, description="Tokens the server samples for the sync check")
    tolerance: float = Field(
        0.5,
        gt=0,
        description="Sync-check difference (nats) above which a warning says the server is not serving "
        "the trainer's weights (fp32: ~1e-6; bf16: ~1e-2; another base model: > 1)",
    )


class WandbSettings(BaseModel):
    """Weights & Biases logging."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    project: str | None = Field(None, description="wandb project (None = wandb off)")
    mode: Literal["offline", "online"] = Field("offline", description="wandb mode")


# The flat keys of the release before, each → where it moved (warned; they go in the next release).
MOVED = {
    **{f"lora_{k}": f"lora.{k}" for k in LoraSettings.model_fields},
    **{f"is_{k}": f"importance.{k}" for k in ImportanceSampling.model_fields},
    **{f"red_{k}": f"red.{k}" for k in REDConfig.model_fields},
    **{f"sync_{k}": f"sync.{k}" for k in SyncCheck.model_fields},
    **{f"wandb_{k}": f"wandb.{k}" for k in WandbSettings.model_fields},
    "served_model": "served_model_name",  # the contract's name, as every service spells it now
}


class TrainerSettings(ServiceSettings):
    """Everything the trainer reads: model, engine, loss, batching, RED, publishing, checkpoints, logging."""

    model_config = service_config("CODA_TRAINER_")
    toml_section: ClassVar[str] = "trainer"
    contract_fields: ClassVar[dict[str, str]] = contract_names()
    shared_keys: ClassVar[dict[str, str]] = {"model": "model", "redis_url": "redis_url", **contract_fields}
    moved_keys: ClassVar[dict[str, str]] = MOVED

    # ---------------------------------------------------------------- model and engine
    model: str = Field("models/tiny", description="Hugging Face model folder of the initial policy")
    reference_model: str | None = Field(
        None, description="Folder of the fixed KL reference (default: the initial policy `model`)"
    )
    finetune: Literal["full", "lora"] = Field("full", description="Full fine-tuning or a LoRA adapter (peft)")
    lora: LoraSettings = Field(default_factory=LoraSettings, description="The LoRA adapter ([trainer.lora])")
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage 0-3")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory")
    precision: Precision = Field(
        "auto",
        description="Matmul precision. auto: bf16 where the hardware multiplies it natively (a GPU with bf16; "
        "a CPU with AVX512-BF16 or AMX), else fp32. On GPU bf16 weights (DeepSpeed bf16); on CPU fp32 weights "
        "and the decoder under bf16 autocast. The output head, logprobs, entropy and losses stay fp32; the "
        "sampler/trainer logprob mismatch this adds shows in the mismatch metrics and the sync check",
    )
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up steps")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="After the warm-up: constant, or a decay to lr·lr_min_ratio at max_steps"
    )
    lr_min_ratio: float = Field(0.0, ge=0, le=1, description="Learning-rate floor of a decay, as a share of lr")
    lr_decay_steps: int = Field(0, ge=0, description="Decay over the last N steps only (0 = from the warm-up on)")
    grad_clip: float = Field(1.0, ge=0, description="Gradient-norm clip (0 = off)")
    seed: int = Field(0, description="Seed of torch / numpy / python RNGs")

    # ---------------------------------------------------------------- batching
    groups_per_step: int = contract_field("groups_per_step")
    max_steps: int = Field(0, ge=0, description="Stop after this many optimizer steps (0 = run forever)")
    micro_batch_tokens: int = Field(
        512,
        ge=16,
        description="Token budget of one packed micro-batch. Activation memory grows with it (~1.3 MB a token on "
        "SmolLM2 + LoRA); on CPU 512 was as fast per token as 1024 and 4096, with a trainer peak of 2.2 GB "
        "against 3.5 GB at 1024 (256: 1.7 GB, 1.2x the time; bench/step_profile.py)",
    )
    packing: bool = Field(True, description="Pack samples into micro-batches (False: one padded row per sample)")
    share_prompts: bool = Field(
        True,
        description="With packing: the samples of one prompt share a single copy of it in a micro-batch (the "
        "prompt's forward and backward run once per group instead of once per sample; same gradient)",
    )
    logprob_chunk: int = Field(1024, ge=1, description="Tokens per chunk when computing logprobs from logits")
    temperature: float = contract_field("temperature")
    max_staleness: int = contract_field("max_staleness")
    stale_policy: Literal["drop", "correct"] = Field(
        "drop", description="Stale samples: drop them (counted) or keep them with importance correction"
    )
    read_block_ms: int = Field(1000, ge=1, description="How long one stream read waits for new groups")

    # ---------------------------------------------------------------- loss
    advantage: Literal["grpo", "dr_grpo", "rloo", "rft"] = Field(
        "grpo",
        description="Group-relative advantage estimator; rft: rejection-sampling fine-tuning, advantage 1 on the "
        "samples whose reward reaches rft_threshold and 0 elsewhere (the policy's own correct samples as "
        "demonstrations: the arm RL must beat)",
    )
    rft_threshold: float = Field(
        0.5,
        description="advantage = rft: the reward from which a sample counts as correct (0.5: F1 >= 0.5 under the "
        "search agents' F1 reward; CoDA's per-role rewards are 6*F1 - 3 + shaping, where 0 means F1 ~0.5)",
    )
    role_baseline: Literal["inherit", "per_role", "pooled"] = Field(
        "inherit", description="Executors inherit the planner advantage, get their own baseline, or share one"
    )
    clip_low: float = Field(0.2, ge=0, description="PPO clip epsilon below 1")
    clip_high: float = Field(0.28, ge=0, description="PPO clip epsilon above 1 (clip-higher)")
    dual_clip: float | None = Field(None, description="Dual-clip constant c (> 1) for negative advantages")
    loss_agg: Literal["token-mean", "seq-mean"] = Field("token-mean", description="Loss aggregation")
    kl_coef: float = Field(0.0, ge=0, description="KL-to-reference coefficient (0 = no reference model)")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator")
    entropy_coef: float = Field(0.0, description="Entropy bonus coefficient")
    zero_advantage: Literal["train", "skip", "drop"] = Field(
        "skip",
        description="Samples whose advantage is 0 (every reward of their group equal) and that have no gradient "
        "(no KL or entropy term). train: forward/backward them like any other. skip: leave them out of the "
        "forward/backward but keep them in the loss's normaliser, so the gradient equals train's (the step's "
        "entropy and mismatch metrics then cover the trained samples); a step of only such samples trains the "
        "shortest one, so the optimizer still steps. drop: leave them out of the step and of the normaliser "
        "(DAPO's dynamic sampling: the other samples' gradient weighs more); a batch left with nothing makes "
        "no step. Counted as skipped_zero_advantage. The recipes' older key skip_zero_advantage = true/false "
        "means drop/train",
    )
    importance: ImportanceSampling = Field(
        default_factory=ImportanceSampling, description="Importance sampling ([trainer.importance])"
    )

    # ---------------------------------------------------------------- RED / SFT co-training
    sft_data: str | None = Field(None, description="SFT demonstrations JSONL (from make-sft); None = GRPO only")
    sft_batch: int = Field(4, ge=1, description="Demonstrations per optimizer step")
    sft_coef: float = Field(0.1, ge=0, description="SFT loss coefficient (multiplied by the RED weight)")
    red: REDConfig = Field(default_factory=REDConfig, description="The SFT loss's weight, RED ([trainer.red])")
    sft_only: bool = Field(
        False,
        description="SFT only (the RED ablations' baseline, and a warm start): read no rollouts; every step "
        "trains on sft_batch demonstrations at weight sft_coef and is published as usual, so "
        "the stack needs no rollout service. Needs sft_data and a red.mode other than grpo_only",
    )

    # ---------------------------------------------------------------- publishing
    inference_url: str | None = Field(
        None,
        description="Inference server of the sync check (the trainer loads no weights into servers: the rollout "
        "loads every published version into every server)",
    )
    served_model_name: str = contract_field("served_model_name")
    sync: SyncCheck = Field(default_factory=SyncCheck, description="The sync check ([trainer.sync])")
    publish_every: int = Field(1, ge=1, description="Publish weights every k optimizer steps")
    weights_dir: str = Field("runs/weights", description="Where published weights are written")
    keep_weights: int = Field(
        3,
        ge=1,
        description="Published versions kept on disk (older folders are deleted; which adapters stay loaded on "
        "the servers is the rollout's keep_adapters)",
    )

    # ---------------------------------------------------------------- checkpoints
    checkpoint_dir: str = Field("runs/checkpoints", description="Checkpoint folder")
    checkpoint_every: int = Field(1, ge=1, description="Checkpoint every k steps (groups are acked after)")
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept (last K)")
    resume: Literal["auto", "never"] = Field("auto", description="auto: continue from the latest checkpoint")

    # ---------------------------------------------------------------- several ranks (torchrun)
    collective_timeout_s: float = Field(
        600,
        ge=10,
        description="Several ranks: once training runs, a collective that waits this long for another rank "
        "ends the job (a rank that died, hangs or is cut off; exit code 1), and the same command resumes "
        "from the last checkpoint. Must exceed rank 0's longest solo work (a publish into the server); "
        "waiting for groups is not one. Start-up waits max(this, dependency_timeout_s)",
    )

    # ---------------------------------------------------------------- Redis
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis holding the streams")
    stream: str = contract_field("stream")
    consumer_group: str = Field("trainer", description="Consumer group on the stream")
    consumer: str = Field("trainer-0", description="This trainer's consumer name (stable across restarts)")
    weights_stream: str = contract_field("weights_stream")
    version_key: str = contract_field("version_key")
    admission_key: str = contract_field("admission_key")
    published_key: str = contract_field("published_key")
    dependency_timeout_s: float = Field(
        600,
        gt=0,
        description="Redis or the inference server unreachable this long (retried with backoff "
        "meanwhile) ends the trainer; shorter outages are waited out",
    )

    # ---------------------------------------------------------------- observability
    host: str = Field("127.0.0.1", description="Bind address of /health and /metrics")
    port: int = Field(8003, ge=0, le=65535, description="HTTP port of /health and /metrics (0 = off)")
    log_dir: str = Field("runs/logs", description="JSONL log and PNG plots")
    plot_every: int = Field(10, ge=1, description="Redraw the PNG plots every k steps")
    wandb: WandbSettings = Field(default_factory=WandbSettings, description="wandb logging ([trainer.wandb])")

    @model_validator(mode="before")
    @classmethod
    def _older_keys(cls, data: object) -> object:
        """``skip_zero_advantage`` (a bool) came before ``zero_advantage``: true was today's drop.
        ``server_check_s`` is gone: the rollout alone loads weights into servers, a restarted one included."""
        if isinstance(data, dict) and "server_check_s" in data:
            raise ValueError(
                "server_check_s was removed: the trainer no longer loads weights into the inference server; "
                "the rollout's fleet watch loads every published version into every server, one that restarted "
                "included (fleet_probe_s in [rollout] sets how often it looks). Delete the key."
            )
        if isinstance(data, dict) and "skip_zero_advantage" in data:
            data = dict(data)
            old = data.pop("skip_zero_advantage")
            data.setdefault("zero_advantage", "drop" if str(old).lower() in ("true", "1") else "train")
        return data

    @model_validator(mode="after")
    def _check(self) -> TrainerSettings:
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError("dual_clip must be > 1")
        if self.finetune == "lora" and self.zero_stage == 3:
            raise ValueError("LoRA with ZeRO-3 is not supported: use zero_stage <= 2")
        if self.sft_only and self.red.mode == "grpo_only":
            raise ValueError(
                "sft_only trains on demonstrations only: [trainer.red] mode grpo_only leaves nothing to train"
            )
        return self
