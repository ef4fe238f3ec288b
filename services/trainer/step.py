"""One optimizer step: RL micro-batches (and the step's SFT micro-batches) forward/backward, then ``step``.

Micro-batches are token-budgeted, so their number varies from step to step: the engine runs with a
nominal accumulation of 1 and the step boundary is set by hand before the last backward. Losses are
normalised by global counts (all micro-batches, all ranks), so the gradient does not depend on how the
batch was split. DeepSpeed averages gradients over ranks, hence the factor ``world`` in each loss.
Ranks that have fewer micro-batches run empty ones so every rank joins every collective.

The RL objective of one micro-batch (``Objective``): the trainer's tensors handed to ``rl.loss.rl_loss``; its metrics (the
typed ``metrics.RlMetrics``) as sums over a step's micro-batches (``RlSums``).

Two ways to use the sampler's logprobs μ (recorded per token by the rollout), chosen by ``[trainer.importance] mode``:
  ``none`` (default; verl calls it "bypass" mode): one optimizer step per batch with the PPO ratio taken against
      μ itself, so no extra forward pass for π_old; the clipped ratio covers both the sampler/trainer
      mismatch and the staleness of off-policy samples;
  ``token`` / ``sequence`` / ``token+sequence`` (decoupled): π_old is the current policy (detached, ratio 1),
      and the truncated / sequence-masked importance weights π/μ do the off-policy correction.
All terms share the step's global normaliser; DeepSpeed averages gradients over ranks, hence ``× world``.

The learning-rate multiplier per optimizer step (``lr_multiplier``, what the engine's ``LambdaLR`` multiplies
``lr`` by). Pure Python.

warm-up (step < W):    (step + 1) / W
constant:              1
linear / cosine decay: 1 until the decay starts at S, then with progress p = (step − S) / (T − S), clamped
    to [0, 1], T = max_steps:
    linear: m + (1 − m)·(1 − p)        cosine: m + (1 − m)·(1 + cos(π·p)) / 2
with m = ``min_ratio`` and S = W, or S = max(W, T − D) when the decay spans only the last D steps
(``decay_steps``; warm-up, stable, decay). Without a step budget (T = 0, train forever) a decay has nothing
to end at, so the multiplier stays 1 after the warm-up.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch

from services.trainer import faults
from services.trainer.config import TrainerSettings
from services.trainer.logprobs import PolicyLogprobs, batch_inputs
from services.trainer.metrics import RlMetrics, added, flatten, means, unflatten, weighted
from services.trainer.packing import MicroBatch, TrainSeq, empty_batch, loss_view, pack, pack_shared, pad
from services.trainer.rl.loss import ClipConfig, LossConfig, LossInputs, mismatch_metrics, rl_loss
from shared.log import get_logger

if TYPE_CHECKING:  # the engine imports lr_multiplier from here
    from services.trainer.engine import Engine

log = get_logger(__name__)


# ---------------------------------------------------------------- the RL objective of one micro-batch
def loss_config(s: TrainerSettings) -> LossConfig:
    return LossConfig(
        clip=ClipConfig(clip_low=s.clip_low, clip_high=s.clip_high, dual_clip=s.dual_clip),
        agg=s.loss_agg,
        kl_coef=s.kl_coef,
        kl_estimator=s.kl_estimator,
        entropy_coef=s.entropy_coef,
        importance=s.importance,
    )


@dataclass
class Objective:
    """Callable with the ``step.RlLoss`` signature: (this micro-batch's loss × world, its metrics' ``RlSums``)."""

    settings: TrainerSettings
    cfg: LossConfig = field(init=False)

    def __post_init__(self) -> None:
        self.cfg = loss_config(self.settings)

    def __call__(
        self, logp: torch.Tensor, entropy: torch.Tensor, batch: MicroBatch, norms: dict[str, float]
    ) -> tuple[torch.Tensor, RlSums]:
        sampler = batch.fields["old_logp"]
        bypass = self.cfg.importance.mode == "none"
        inputs = LossInputs(
            logp=logp,
            old_logp=sampler if bypass else logp.detach(),
            advantages=batch.fields["adv"],
            mask=batch.target_mask,
            ref_logp=batch.fields.get("ref_logp"),
            sampler_logp=None if bypass else sampler,
            entropy=entropy,
            segment_ids=batch.seq.to(logp.device),
        )
        normaliser = norms["tokens"] if self.cfg.agg == "token-mean" else norms["sequences"]
        loss, metrics = rl_loss(inputs, self.cfg, normaliser)
        if bypass:  # how far the trainer's logprobs are from the sampler's (0 on-policy with synced weights)
            metrics.update(mismatch_metrics(logp, sampler, batch.target_mask))
        mask = batch.target_mask
        metrics["staleness_mean"] = float((batch.fields["staleness"] * mask).sum() / mask.sum().clamp(min=1))
        tokens = metrics.pop("num_tokens")  # the micro-batch's trained tokens: the weight of its local means
        return loss * norms["world"], RlSums.of(RlMetrics(**metrics), tokens)


@dataclass
class RlSums:
    """The RL objective's metrics summed over micro-batches (and ranks), averaged once at the end (``means``).

    ``sums``: for a ``share`` metric (``pg_loss``, ``loss``: already a share of the step's value) the sum of the
    shares; for a ``token_mean`` metric Σ local mean × the micro-batch's trained tokens, so that ``means``
    weights each micro-batch by its trained tokens however the step was split. ``tokens``: those tokens' sum.
    """

    sums: RlMetrics = field(default_factory=RlMetrics)
    tokens: float = 0.0

    @classmethod
    def of(cls, metrics: RlMetrics, tokens: float) -> RlSums:
        """One micro-batch's metrics (local means and shares, as ``rl_loss`` returns them) and trained tokens."""
        return cls(weighted(metrics, tokens), tokens)

    def __add__(self, other: RlSums) -> RlSums:
        return RlSums(added(self.sums, other.sums), self.tokens + other.tokens)

    def means(self) -> RlMetrics:
        """Each metric over all micro-batches added: the token-weighted mean, or the summed share."""
        return means(self.sums, self.tokens)


# ---------------------------------------------------------------- one optimizer step
# (logp, entropy, batch, global normalisers) -> (loss for this micro-batch, its metrics as sums to add up)
RlLoss = Callable[[torch.Tensor, torch.Tensor, MicroBatch, dict[str, float]], tuple[torch.Tensor, RlSums]]


@dataclass
class StepInput:
    rl: list[TrainSeq]  # fields: old_logp, adv, staleness
    sft: list[TrainSeq] = field(default_factory=list)  # demonstrations; mask 1 on the imitated tokens
    sft_weight: float = 0.0  # coefficient of the SFT cross-entropy this step (sft_coef × RED weight)
    # The RL samples the loss is normalised over, where it is more than ``rl``: samples left out of the
    # forward/backward for having no gradient still count, so the gradient is the whole batch's.
    rl_norm: list[TrainSeq] | None = None


# ---------------------------------------------------------------- what a step did
# Its sums over micro-batches and ranks (``StepMetrics``) and its result (``StepResult``), whose means are taken
# once, from the totals: sums travel as sums (one all-reduce for all of them) and each mean divides by its own
# count at the end, so a step's numbers do not depend on how its batch was split into micro-batches or ranks.


@dataclass
class StepMetrics:
    """Sums over the step's micro-batches: on one rank while it runs, then over all ranks (``total``)."""

    rl: RlSums = field(default_factory=RlSums)
    rl_entropy_sum: float = 0.0  # Σ entropy over trained RL tokens
    sft_entropy_sum: float = 0.0  # Σ entropy over trained demonstration tokens
    sft_loss_sum: float = 0.0  # Σ −log p over trained demonstration tokens
    tokens: float = 0.0  # real tokens through the model (prompts included), RL and SFT

    def total(self, sum_over_ranks: Callable[[list[float]], list[float]]) -> StepMetrics:
        """These sums added up over ranks by ``sum_over_ranks``, called once (one collective for all).

        Every rank flattens the same dataclasses in their declared field order, so the values line up; a
        metric no rank measured travels as NaN and comes back None.
        """
        return unflatten(self, sum_over_ranks(flatten(self)))


@dataclass(frozen=True)
class StepResult:
    """One optimizer step, the same on every rank: the totals, the step's counts, what the optimizer reported."""

    metrics: StepMetrics  # summed over all ranks
    rl_tokens: float  # trained RL tokens of the step (all ranks)
    rl_sequences: float
    sft_tokens: float  # demonstration tokens given; trained only when SFT micro-batches ran
    sft_weight: float  # the SFT loss's coefficient this step (``StepInput.sft_weight``)
    rl_micro_batches: int
    sft_micro_batches: int
    grad_norm: float
    lr: float
    seconds: float  # forward, backward and optimizer step

    @property
    def trained(self) -> bool:
        """Whether any token went through the model (a step without one took no optimizer step)."""
        return self.metrics.tokens > 0

    @property
    def micro_batches(self) -> int:
        return self.rl_micro_batches + self.sft_micro_batches

    @property
    def sft_trained_tokens(self) -> float:
        """Demonstration tokens the SFT loss saw (none when its weight was 0: the demonstrations were skipped)."""
        return self.sft_tokens if self.sft_micro_batches else 0.0

    def rl_entropy(self) -> float | None:
        """Mean entropy over the trained RL tokens (RED's RL input); None when there was none."""
        return _mean(self.metrics.rl_entropy_sum, self.rl_tokens)

    def sft_entropy(self) -> float | None:
        """Mean entropy over the trained demonstration tokens (RED's SFT input); None without SFT."""
        return _mean(self.metrics.sft_entropy_sum, self.sft_trained_tokens)

    def sft_loss(self) -> float | None:
        """Token-mean cross-entropy on the demonstrations, before the SFT weight; None without SFT."""
        return _mean(self.metrics.sft_loss_sum, self.sft_trained_tokens)


def _mean(total: float, count: float) -> float | None:
    # None, not 0: an entropy of 0 would read as a collapsed policy, and RED must skip a side it did not measure.
    return total / count if count > 0 else None


def _all_reduce(values: list[float], op: str, world: int) -> list[float]:
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    torch.distributed.all_reduce(
        t, op=torch.distributed.ReduceOp.MAX if op == "max" else torch.distributed.ReduceOp.SUM
    )
    return t.tolist()


def layout(seqs: list[TrainSeq], budget: int, packing: bool, share_prompts: bool = False) -> list[MicroBatch]:
    if not packing:
        return pad(seqs, budget)
    return pack_shared(seqs, budget) if share_prompts else pack(seqs, budget)


def _shard(seqs: list[TrainSeq], rank: int, world: int) -> list[TrainSeq]:
    return seqs[rank::world]


def _counts(seqs: list[TrainSeq]) -> list[float]:
    return [float(sum(sum(s.mask[1:]) for s in seqs)), float(len(seqs))]


@torch.no_grad()
def _attach_reference(ref: PolicyLogprobs, batches: list[MicroBatch], device: torch.device) -> None:
    for b in batches:
        b.fields["ref_logp"], _ = ref(**batch_inputs(b, device))
        b.fields["ref_logp"] = b.fields["ref_logp"].cpu()


def train_step(
    eng: Engine,
    inp: StepInput,
    rl_loss: RlLoss,
    ref: PolicyLogprobs | None,
    budget: int,
    packing: bool = True,
    share_prompts: bool = True,
) -> StepResult:
    """Forward/backward every micro-batch of ``inp``, then one optimizer step; the result is the same on every rank."""
    start = time.perf_counter()
    rl_seqs, sft_seqs = _shard(inp.rl, eng.rank, eng.world), _shard(inp.sft, eng.rank, eng.world)
    # Every rank holds the whole step's input (rank 0 reads and broadcasts), so global counts are local.
    (rl_tokens, rl_seqs_n), (sft_tokens, _) = _counts(inp.rl), _counts(inp.sft)
    norm_tokens, norm_seqs = _counts(inp.rl_norm) if inp.rl_norm is not None else (rl_tokens, rl_seqs_n)
    norms = {"tokens": max(norm_tokens, 1.0), "sequences": max(norm_seqs, 1.0), "world": float(eng.world)}
    rl_batches = layout(rl_seqs, budget, packing, share_prompts)
    sft_batches = layout(sft_seqs, budget, packing) if inp.sft_weight > 0 else []
    n_rl, n_sft = (int(x) for x in _all_reduce([len(rl_batches), len(sft_batches)], "max", eng.world))
    fields = sorted(rl_seqs[0].fields) if rl_seqs else ["adv", "old_logp", "staleness"]
    rl_batches += [empty_batch(fields) for _ in range(n_rl - len(rl_batches))]
    sft_batches += [empty_batch([]) for _ in range(n_sft - len(sft_batches))]
    if ref is not None:
        _attach_reference(ref, rl_batches, eng.device)
    plan = [("rl", b) for b in rl_batches] + [("sft", b) for b in sft_batches]
    counts = {
        "rl_tokens": rl_tokens,
        "rl_sequences": rl_seqs_n,
        "sft_tokens": sft_tokens,
        "sft_weight": inp.sft_weight,
        "rl_micro_batches": n_rl,
        "sft_micro_batches": n_sft,
    }
    if not plan:
        # Nothing to learn from (every sample dropped or untrained, no demonstrations): an optimizer step
        # without gradients would fail inside DeepSpeed, and skipping it changes nothing.
        log.warning(
            "step has no trainable tokens; optimizer step skipped",
            extra={"rl_samples": len(inp.rl), "sft_samples": len(inp.sft)},
        )
        lr = float(eng.engine.get_lr()[0])
        return StepResult(StepMetrics(), **counts, grad_norm=0.0, lr=lr, seconds=time.perf_counter() - start)
    metrics = StepMetrics()  # this rank's sums
    eng.engine.train()
    for i, (kind, batch) in enumerate(plan):
        eng.engine.set_gradient_accumulation_boundary(i == len(plan) - 1)
        logp, ent = eng.engine(**batch_inputs(batch, eng.device))
        logp, ent, view = loss_view(batch, logp, ent)  # a prefix-tree batch: one entry per sample's token
        mask = view.target_mask.to(eng.device)
        entropy_sum = float((ent.detach() * mask).sum())
        if kind == "rl":
            loss, parts = rl_loss(logp, ent, _on(view, eng.device), norms)
            metrics.rl += parts
            metrics.rl_entropy_sum += entropy_sum
        else:
            # Token-mean cross-entropy over the step's demonstration tokens, weighted (RED).
            nll_sum = -(logp * mask).sum()
            loss = nll_sum / max(sft_tokens, 1.0) * inp.sft_weight * eng.world
            metrics.sft_loss_sum += float(nll_sum.detach())
            metrics.sft_entropy_sum += entropy_sum
        eng.engine.backward(loss, scale_wrt_gas=False)
        metrics.tokens += batch.num_tokens
        if faults.ARMED:
            faults.point("mid_step")
    local_norm = _param_grad_norm(eng) if eng.engine.zero_optimization_stage() == 0 else None
    eng.engine.step()
    return StepResult(
        metrics.total(lambda values: _all_reduce(values, "sum", eng.world)),
        **counts,
        grad_norm=_grad_norm(eng, local_norm),
        lr=float(eng.engine.get_lr()[0]),
        seconds=time.perf_counter() - start,
    )


def _on(batch: MicroBatch, device: torch.device) -> MicroBatch:
    if device.type == "cpu":
        return batch
    return MicroBatch(
        input_ids=batch.input_ids,
        position_ids=batch.position_ids,
        attention_mask=batch.attention_mask,
        targets=batch.targets,
        target_mask=batch.target_mask.to(device),
        seq=batch.seq,
        fields={k: v.to(device) for k, v in batch.fields.items()},
    )


def _param_grad_norm(eng: Engine) -> float:
    """Gradient norm before clipping, read off the parameters (ZeRO-0 keeps full grads on them)."""
    grads = [p.grad.detach().float().norm() ** 2 for p in eng.policy.parameters() if p.grad is not None]
    return float(torch.stack(grads).sum().sqrt()) if grads else 0.0


def _grad_norm(eng: Engine, local: float | None) -> float:
    norm = eng.engine.get_global_grad_norm()
    if norm is None:
        return float("nan") if local is None else local
    return float(norm)


# ---------------------------------------------------------------- the learning-rate schedule
Schedule = Literal["constant", "linear", "cosine"]


def lr_multiplier(
    step: int,
    *,
    warmup: int = 0,
    total: int = 0,
    schedule: Schedule = "constant",
    min_ratio: float = 0.0,
    decay_steps: int = 0,
) -> float:
    if warmup and step < warmup:
        return (step + 1) / warmup
    start = max(warmup, total - decay_steps) if decay_steps else warmup
    if schedule == "constant" or total <= start:
        return 1.0
    p = min(1.0, max(0.0, (step - start) / (total - start)))
    if schedule == "linear":
        return min_ratio + (1.0 - min_ratio) * (1.0 - p)
    if schedule == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"unknown learning-rate schedule {schedule!r}")
