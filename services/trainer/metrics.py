"""Every quantity the trainer reports, defined once: its key, what it means, whether it is a Prometheus gauge
and a plot, and (for the RL objective's per-micro-batch metrics) how a step folds it over micro-batches.

One name per quantity everywhere: the key is the ``train.jsonl`` key, the wandb key, the plot's label and the
live line's key; the Prometheus gauge is ``coda_trainer_`` + the key with ``/`` written ``_`` (``gauge_name``).
``observe.Observer`` makes its gauges and plots from this table, ``step_record`` refuses a key it does not
define, and the glossary (``docs/metrics.md``) reads the meanings from here.

Torch-free on purpose: the glossary imports it without loading the trainer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

GAUGE_PREFIX = "coda_trainer_"
REWARD_PREFIX = "reward/"  # ``reward/<component>``: one key per component the agent's reward returns

# How a step folds an RL objective metric over its micro-batches (and ranks):
#   share: each micro-batch reports its share of the step's value (the global normaliser divided it): summed;
#   token_mean: a micro-batch's local mean, weighted by its trained tokens.
Reduce = Literal["share", "token_mean"]


@dataclass(frozen=True)
class Metric:
    key: str
    meaning: str
    gauge: bool = False  # exported as ``gauge_name`` (the last step's value)
    plotted: bool = False  # drawn in ``losses.png``
    reduce: Reduce | None = None  # set for the RL objective's per-micro-batch metrics (``batch_loss.RlMetrics``)

    @property
    def gauge_name(self) -> str:
        return gauge_name(self.key)


def gauge_name(key: str) -> str:
    """The Prometheus name of a record key: the one rule that maps a key to its gauge."""
    return GAUGE_PREFIX + key.replace("/", "_")


def _rl(key: str, meaning: str, reduce: Reduce = "token_mean", **kw: bool) -> Metric:
    return Metric(key, meaning, reduce=reduce, **kw)


# In the order the plots stack them and the ranks' sums flatten them.
METRICS: tuple[Metric, ...] = (
    Metric(
        "reward_mean",
        "mean reward of the step's RL samples (sampled at the recipe's temperature, not greedy)",
        gauge=True,
        plotted=True,
    ),
    _rl(
        "loss",
        "the RL loss: policy-gradient loss, plus the KL term, minus the entropy bonus (SFT not included)",
        reduce="share",
        gauge=True,
        plotted=True,
    ),
    _rl("pg_loss", "the clipped policy-gradient (PPO/GRPO) loss alone", reduce="share", gauge=True, plotted=True),
    _rl(
        "kl",
        "KL to the fixed reference model, mean per trained token (only when `kl_coef > 0`)",
        gauge=True,
        plotted=True,
    ),
    Metric(
        "rl_entropy",
        "mean entropy of the policy on the step's trained RL tokens (what RED compares)",
        gauge=True,
        plotted=True,
    ),
    Metric(
        "sft_loss",
        "mean cross-entropy per demonstration token (before its weight `red/sft_loss_weight`)",
        gauge=True,
        plotted=True,
    ),
    Metric(
        "red/final_weight",
        "RED's weight: entropy weight × accuracy factor, clamped to [floor, G²]",
        gauge=True,
        plotted=True,
    ),
    _rl(
        "clip_fraction",
        "share of trained tokens whose ratio π/π_old was clipped (either side or dual clip)",
        gauge=True,
        plotted=True,
    ),
    Metric("tokens_per_second", "tokens through the model per second of the optimizer step", gauge=True, plotted=True),
    # ------------------------------------------------------------ the step
    Metric("step", "optimizer steps taken so far (the step this line is about)", gauge=True),
    Metric("version", "policy version published after this step (the weights the rollout samples next)"),
    Metric("time", "Unix time the line was written"),
    Metric("step_seconds", "wall seconds of the whole step, reading its groups from Redis included", gauge=True),
    Metric("seconds", "wall seconds of the optimizer step itself (forward, backward, update)"),
    Metric("tokens", "tokens through the model this step (RL and SFT)"),
    Metric("total_tokens", "tokens through the model since the run began"),
    Metric("rl_tokens", "trained RL tokens this step (loss mask 1: tokens the policy sampled)"),
    Metric("rl_sequences", "RL samples trained this step"),
    Metric("sft_tokens", "demonstration tokens trained this step (RED / SFT co-training)"),
    Metric("micro_batches", "micro-batches the step was split into (token budget `micro_batch_tokens`)"),
    Metric("sft_entropy", "mean entropy on the demonstration tokens of the step (what RED compares)"),
    Metric("grad_norm", "gradient norm before clipping", gauge=True),
    Metric("lr", "learning rate of the step", gauge=True),
    # ------------------------------------------------------------ the RL objective, per micro-batch
    _rl("clip_low_fraction", "share clipped at 1 − ε_low (negative advantage)"),
    _rl("clip_high_fraction", "share clipped at 1 + ε_high (positive advantage)"),
    _rl("dual_clip_fraction", "share held by the dual clip (negative advantage, ratio above `dual_clip`)"),
    _rl("ratio_mean", "mean ratio π/π_old on trained tokens (1.0 on-policy)"),
    _rl("approx_kl", "k3 estimate of KL(π_old ‖ π) on trained tokens: how far this step moved the policy"),
    _rl("ppo_kl", "k1 estimate of KL(π_old ‖ π): mean of log π_old − log π"),
    _rl(
        "is_weight_mean",
        "mean importance weight π_old/μ against the sampler's logprobs μ (after truncation)",
        gauge=True,
    ),
    _rl("is_ess", "normalised effective sample size of the importance weights (1.0: all equal)", gauge=True),
    _rl("is_token_truncated_fraction", "share of tokens whose importance weight was truncated at `is_cap`"),
    _rl(
        "is_seq_masked_fraction",
        "share of sequences masked out for an importance weight outside its bounds",
        gauge=True,
    ),
    _rl("mismatch_kl_k1", "k1 estimate of KL(sampler ‖ trainer): how far the server's logprobs are from the trainer's"),
    _rl("mismatch_kl_k3", "k3 estimate of the same mismatch (always ≥ 0; 0 with weights in sync)", gauge=True),
    _rl(
        "staleness_mean",
        "mean staleness of the trained tokens, in policy versions (live version − the version that sampled them)",
        gauge=True,
    ),
    # ------------------------------------------------------------ RED
    Metric(
        "red/sft_loss_weight",
        "weight of the SFT loss this step: `sft_coef` × RED's final weight (without RED: the fixed coefficient)",
        gauge=True,
    ),
    Metric("red/entropy_weight", "RED's entropy-change ratio |ΔH_sft| / |ΔH_rl|, clamped to [1, G]", gauge=True),
    Metric(
        "red/accuracy_factor", "RED's accuracy factor G^(1 − 2·acc): more SFT while the policy is wrong", gauge=True
    ),
    Metric(
        "red/batch_accuracy",
        "share of planner (non-executor) samples whose answer scored above the threshold (−1: no RL sample this step)",
    ),
    Metric("red/h_rl", "EMA of the RL tokens' entropy"),
    Metric("red/h_rl_prev", "that EMA one step earlier"),
    Metric("red/h_sft", "EMA of the demonstration tokens' entropy"),
    Metric("red/h_sft_prev", "that EMA one step earlier"),
    # ------------------------------------------------------------ the step's groups
    Metric("reward_std", "standard deviation of the step's rewards"),
    Metric("groups", "prompt groups trained this step (0: demonstrations only, e.g. the warm start)"),
    Metric("zero_variance_groups", "groups whose samples all got the same reward: no advantage, no learning signal"),
    Metric("skipped_zero_advantage", "samples not run through the model for having advantage 0 (`zero_advantage`)"),
    Metric("dropped_stale", "samples dropped for staleness since the run began", gauge=True),
    Metric("dropped_stale_step", "samples dropped for staleness this step"),
    Metric("staleness_max", "largest staleness of the step's groups, in policy versions", gauge=True),
    Metric("queue_lag", "groups in the `trajectories` stream not yet read by the trainer", gauge=True),
    Metric("queue_pending", "groups read by the trainer and not yet acknowledged (awaiting a checkpoint)", gauge=True),
    # ------------------------------------------------------------ the publish after the step
    Metric("publish_seconds", "seconds to write and announce this step's weights", gauge=True),
    Metric(
        "sync_max_abs_diff",
        "largest |server − trainer| logprob of the sync check after the publish (`sync_check` on)",
        gauge=True,
    ),
)

BY_KEY: Mapping[str, Metric] = {m.key: m for m in METRICS}
GAUGES: tuple[Metric, ...] = tuple(m for m in METRICS if m.gauge)
PLOTTED: tuple[str, ...] = tuple(m.key for m in METRICS if m.plotted)
RL_METRICS: tuple[str, ...] = tuple(m.key for m in METRICS if m.reduce is not None)
RL_SHARES: frozenset[str] = frozenset(m.key for m in METRICS if m.reduce == "share")


def defined(key: str) -> bool:
    return key in BY_KEY or key.startswith(REWARD_PREFIX)


def check_keys(keys: object) -> None:
    """Raise if a record holds a key this table does not define (a new quantity is defined here first)."""
    unknown = sorted(k for k in keys if not defined(k))  # type: ignore[attr-defined]
    if unknown:
        raise KeyError(f"metric(s) {unknown} are not defined in services/trainer/metrics.py")


if len(BY_KEY) != len(METRICS):  # pragma: no cover - a definition error, caught on import
    raise RuntimeError("services/trainer/metrics.py defines a key twice")
