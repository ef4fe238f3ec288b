"""The trainer's metrics, defined once: every quantity a step reports, as fields of typed records, from the RL
objective's micro-batch (``RlMetrics``) to the line of ``train.jsonl`` (``StepRecord``), the ``coda_trainer_*``
Prometheus gauges, the plots and the glossary (``docs/metrics.md``).

A field's metadata (``metric``) says what it means, how micro-batches are folded into the step's value
(``reduce``), whether it is a Prometheus gauge and whether it is plotted. Its log key is its name, or
``<prefix><name>`` inside a part with a prefix (``red/final_weight``); its Prometheus name is the log key with
``/`` mapped to ``_`` (``Metric.series``), after ``coda_trainer_``. A value left None was not measured: it is
left out of the line. Pure Python: the glossary imports it without torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any, Literal, TypeVar

# How a metric of one micro-batch becomes the step's: ``share`` (the global normaliser already divided it: the
# micro-batches' values add up), ``token_mean`` (a local mean: weighted by the micro-batch's trained tokens).
# None: a value computed once per step.
Reduce = Literal["share", "token_mean"]
PROMETHEUS_PREFIX = "coda_trainer_"
REWARD_PREFIX = "reward/"  # ``StepRecord.rewards`` in the line: ``reward/<component>``
T = TypeVar("T")


@dataclass(frozen=True)
class Metric:
    """One quantity: its log key, what it means, how it is reduced, whether it is a gauge, whether plotted."""

    key: str
    description: str
    reduce: Reduce | None = None
    gauge: bool = False  # exported as the Prometheus gauge ``prometheus``
    plotted: bool = False  # drawn in ``losses.png``

    @property
    def series(self) -> str:
        """The Prometheus name after the prefix: the log key, ``/`` mapped to ``_`` (the one rule)."""
        return self.key.replace("/", "_")

    @property
    def prometheus(self) -> str:
        return PROMETHEUS_PREFIX + self.series

    @property
    def help(self) -> str:
        return f"`{self.key}` of the last step: {self.description}"


def metric(description: str, *, reduce: Reduce | None = None, gauge: bool = False, plot: bool = False) -> Any:
    """A record field holding one quantity (None until measured)."""
    return field(default=None, metadata={"metric": (description, reduce, gauge, plot)})


def share(description: str, **kw: bool) -> Any:
    """A metric of the RL objective that each micro-batch reports as its share of the step's value."""
    return metric(description, reduce="share", **kw)


def token_mean(description: str, **kw: bool) -> Any:
    """A metric of the RL objective that each micro-batch reports as a mean over its trained tokens."""
    return metric(description, reduce="token_mean", **kw)


def part(cls: type, prefix: str = "") -> dict[str, Any]:
    """The metadata of a record field holding a record of its own, whose fields join the line (their keys after
    ``prefix``)."""
    return {"part": (cls, prefix)}


def definitions(cls: type, prefix: str = "") -> Iterator[Metric]:
    """Every quantity of the record class ``cls``, its parts' expanded, in declared order."""
    for f in fields(cls):
        if "part" in f.metadata:
            sub, sub_prefix = f.metadata["part"]
            yield from definitions(sub, prefix + sub_prefix)
        elif "metric" in f.metadata:
            description, reduce, gauge, plot = f.metadata["metric"]
            yield Metric(prefix + f.name, description, reduce, gauge, plot)


def line(rec: Any, prefix: str = "") -> dict[str, float]:
    """The measured quantities of the record ``rec`` (its parts' included), by log key, in declared order."""
    out: dict[str, float] = {}
    for f in fields(rec):
        value = getattr(rec, f.name)
        if value is None:
            continue
        if "part" in f.metadata:
            out.update(line(value, prefix + f.metadata["part"][1]))
        elif "metric" in f.metadata:
            out[prefix + f.name] = value
        elif "components" in f.metadata:
            out.update({f"{f.metadata['components']}{k}": v for k, v in value.items()})
    return out


# ---------------------------------------------------------------- folding micro-batches and ranks
def _token_means(rec: T, scale: Callable[[float], float]) -> T:
    """``rec`` with each measured ``token_mean`` field passed through ``scale``; shares as they are."""
    measured = ((f.name, getattr(rec, f.name)) for f in fields(rec) if f.metadata["metric"][1] == "token_mean")
    return replace(rec, **{name: scale(v) for name, v in measured if v is not None})


def weighted(m: T, tokens: float) -> T:
    """A micro-batch's metrics as its contribution to the step's sums: token means × its trained tokens."""
    return _token_means(m, lambda v: v * tokens)


def added(a: T, b: T) -> T:
    """Field-wise sum of two records of sums (a field None in both stays None: not measured)."""
    out = {}
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        out[f.name] = x if y is None else (0.0 if x is None else x) + y
    return replace(a, **out)


def means(sums: T, tokens: float) -> T:
    """The step's values from its sums: token means divided by the step's trained tokens, shares as they are."""
    n = max(tokens, 1.0)
    return _token_means(sums, lambda v: v / n)


def flatten(rec: Any) -> list[float]:
    """Every number of the dataclass ``rec`` in declared order, nested dataclasses in place; None as NaN.

    Each rank flattens the same class, so the lists line up field by field for one all-reduce.
    """
    out: list[float] = []
    for f in fields(rec):
        value = getattr(rec, f.name)
        if is_dataclass(value):
            out += flatten(value)
        else:
            out.append(math.nan if value is None else float(value))
    return out


def unflatten(template: T, values: list[float]) -> T:
    """``flatten``'s inverse, shaped like ``template``: a NaN in a field that may be None (its default) is None."""
    it = iter(values)
    out = _rebuild(template, it)
    if next(it, None) is not None:
        raise ValueError("more values than the record has fields")
    return out


def _rebuild(template: T, it: Iterator[float]) -> T:
    kw = {}
    for f in fields(template):
        value = getattr(template, f.name)
        if is_dataclass(value):
            kw[f.name] = _rebuild(value, it)
        else:
            x = next(it)
            kw[f.name] = None if f.default is None and math.isnan(x) else x
    return replace(template, **kw)


# ---------------------------------------------------------------- the records
@dataclass
class RlMetrics:
    """The RL objective's metrics: of one micro-batch (``step.Objective``), summed (``RlSums``), or the
    step's (``means``). Names are those ``rl.loss.rl_loss`` and its pieces return."""

    loss: float | None = share(
        "the RL loss: policy-gradient loss, plus the KL term, minus the entropy bonus (SFT not included)",
        gauge=True,
        plot=True,
    )
    pg_loss: float | None = share("the clipped policy-gradient (PPO/GRPO) loss alone", gauge=True, plot=True)
    kl: float | None = token_mean(
        "KL to the fixed reference model, mean per trained token (only when `kl_coef > 0`)",
        gauge=True,
        plot=True,
    )
    clip_fraction: float | None = token_mean(
        "share of trained tokens whose ratio π/π_old was clipped (either side or dual clip)",
        gauge=True,
        plot=True,
    )
    clip_low_fraction: float | None = token_mean("share clipped at 1 − ε_low (negative advantage)")
    clip_high_fraction: float | None = token_mean("share clipped at 1 + ε_high (positive advantage)")
    dual_clip_fraction: float | None = token_mean(
        "share held by the dual clip (negative advantage, ratio above `dual_clip`)"
    )
    ratio_mean: float | None = token_mean("mean ratio π/π_old on trained tokens (1.0 on-policy)")
    approx_kl: float | None = token_mean(
        "k3 estimate of KL(π_old ‖ π) on trained tokens: how far this step moved the policy"
    )
    ppo_kl: float | None = token_mean("k1 estimate of KL(π_old ‖ π): mean of log π_old − log π")
    is_weight_mean: float | None = token_mean(
        "mean importance weight π_old/μ against the sampler's logprobs μ (after truncation)",
        gauge=True,
    )
    is_ess: float | None = token_mean(
        "normalised effective sample size of the importance weights (1.0: all equal)", gauge=True
    )
    is_token_truncated_fraction: float | None = token_mean(
        "share of tokens whose importance weight was truncated at `[trainer.importance] cap`"
    )
    is_seq_masked_fraction: float | None = token_mean(
        "share of sequences masked out for an importance weight outside its bounds", gauge=True
    )
    mismatch_kl_k1: float | None = token_mean(
        "k1 estimate of KL(sampler ‖ trainer): how far the server's logprobs are from the trainer's",
    )
    mismatch_kl_k3: float | None = token_mean(
        "k3 estimate of the same mismatch (always ≥ 0; 0 with weights in sync)", gauge=True
    )
    staleness_mean: float | None = token_mean("mean staleness of the trained tokens, in policy versions", gauge=True)


@dataclass
class RedMetrics:
    """RED's state of the step (``rl.red.REDWeights``; its fields' names), logged under ``red/``."""

    entropy_weight: float | None = metric(
        "RED's entropy-change ratio |ΔH_sft| / |ΔH_rl|, clamped to [1, G]", gauge=True
    )
    accuracy_factor: float | None = metric(
        "RED's accuracy factor G^(1 − 2·acc): more SFT while the policy is wrong", gauge=True
    )
    final_weight: float | None = metric(
        "RED's weight: entropy weight × accuracy factor, clamped to [floor, G²]", gauge=True, plot=True
    )
    sft_loss_weight: float | None = metric(
        "weight of the SFT loss this step: `sft_coef` × RED's final weight (without RED: the fixed coefficient)",
        gauge=True,
    )
    batch_accuracy: float | None = metric(
        "share of planner (non-executor) samples whose answer scored above the threshold (−1: no RL sample this step)"
    )
    h_rl: float | None = metric("EMA of the RL tokens' entropy")
    h_rl_prev: float | None = metric("that EMA one step earlier")
    h_sft: float | None = metric("EMA of the demonstration tokens' entropy")
    h_sft_prev: float | None = metric("that EMA one step earlier")


@dataclass
class StepRecord:
    """One optimizer step: one line of ``train.jsonl``. ``rewards``: each reward component's mean over the
    step's samples, logged as ``reward/<component>`` (the glossary describes the components)."""

    step: int | None = metric("optimizer steps taken so far (the step this line is about)", gauge=True)
    version: int | None = metric("policy version published after this step (the weights the rollout samples next)")
    time: float | None = metric("Unix time the line was written")
    step_seconds: float | None = metric(
        "wall seconds of the whole step, reading its groups from Redis included", gauge=True
    )
    seconds: float | None = metric("wall seconds of the optimizer step itself (forward, backward, update)")
    tokens_per_second: float | None = metric(
        "tokens through the model per second of the optimizer step", gauge=True, plot=True
    )
    tokens: float | None = metric("tokens through the model this step (RL and SFT)")
    total_tokens: int | None = metric("tokens through the model since the run began")
    rl_tokens: float | None = metric("trained RL tokens this step (loss mask 1: tokens the policy sampled)")
    rl_sequences: float | None = metric("RL samples trained this step")
    sft_tokens: float | None = metric("demonstration tokens trained this step (RED / SFT co-training)")
    micro_batches: float | None = metric("micro-batches the step was split into (token budget `micro_batch_tokens`)")
    rl: RlMetrics | None = field(default=None, metadata=part(RlMetrics))
    rl_entropy: float | None = metric(
        "mean entropy of the policy on the RL tokens of the step (what RED compares)", gauge=True, plot=True
    )
    sft_entropy: float | None = metric("mean entropy on the demonstration tokens of the step (what RED compares)")
    sft_loss: float | None = metric(
        "mean cross-entropy per demonstration token (before its weight `red/sft_loss_weight`)", gauge=True, plot=True
    )
    grad_norm: float | None = metric("gradient norm before clipping", gauge=True)
    lr: float | None = metric("learning rate of the step", gauge=True)
    red: RedMetrics | None = field(default=None, metadata=part(RedMetrics, "red/"))
    reward_mean: float | None = metric(
        "mean reward of the step's RL samples (sampled at the recipe's temperature, not greedy)", gauge=True, plot=True
    )
    reward_std: float | None = metric("standard deviation of the step's rewards")
    rewards: dict[str, float] = field(default_factory=dict, metadata={"components": REWARD_PREFIX})
    groups: int | None = metric("prompt groups trained this step (0: demonstrations only, e.g. the warm start)")
    zero_variance_groups: int | None = metric(
        "groups whose samples all got the same reward: no advantage, no learning signal"
    )
    signal_share: float | None = metric(
        "share of the step's groups with a learning signal: 1 − `zero_variance_groups` / `groups` (their samples' "
        "rewards differ, so GRPO's advantages are not all 0); not logged on a step without groups",
        gauge=True,
        plot=True,
    )
    skipped_zero_advantage: int | None = metric(
        "samples not run through the model for having advantage 0 (`zero_advantage`)"
    )
    dropped_stale: int | None = metric("samples dropped for staleness since the run began", gauge=True)
    dropped_stale_step: int | None = metric("samples dropped for staleness this step")
    staleness_max: int | None = metric("largest staleness of the step's groups, in policy versions", gauge=True)
    queue_lag: int | None = metric("groups in the `trajectories` stream not yet read by the trainer", gauge=True)
    queue_pending: int | None = metric(
        "groups read by the trainer and not yet acknowledged (awaiting a checkpoint)", gauge=True
    )
    publish_seconds: float | None = metric("seconds to publish this step's weights to the inference server", gauge=True)
    sync_max_abs_diff: float | None = metric(
        "largest |server − trainer| logprob of the sync check after the publish (`[trainer.sync] check` on)", gauge=True
    )


# Every quantity of the log, by key, in declared order: the one list the observer, the glossary and the tests read.
METRICS: dict[str, Metric] = {m.key: m for m in definitions(StepRecord)}
GAUGES: tuple[Metric, ...] = tuple(m for m in METRICS.values() if m.gauge)
PLOTTED: tuple[str, ...] = tuple(m.key for m in METRICS.values() if m.plotted)
