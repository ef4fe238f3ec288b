"""RED: the weight of the SFT co-training loss, from entropy dynamics and planner accuracy. Pure Python (and pydantic, for the settings table).

Per step, with H the token-mean categorical entropy (``logprobs.categorical_entropy``, the same estimator on both sides) kept as
EMAs (decay β) with one step of delay (prev = the EMA before the latest update):
    relative: w_ent = clamp( |1 − H_sft/H_sft_prev| / (|1 − H_rl/H_rl_prev| + ε), 1, G )
    absolute: w_ent = clamp( |H_sft − H_sft_prev| / (|H_rl − H_rl_prev| + ε), 1, G )
    accuracy factor: a = clamp( G^(1 − 2·acc), 1/G, G ),  acc = share of PLANNER (non-executor) rows whose
                     answer score > threshold  (executors answer sub-questions; scoring them against the
                     original question's gold biased upstream's accuracy low)
    final:    w = clamp( w_ent · a, floor, G² ),  floor default 1/G²  (upstream floored it at 1, so a
                     well-performing policy could never get less SFT than the base coefficient)
    SFT loss weight = sft_coef · w
The EMAs are SEEDED FROM THE FIRST MEASUREMENT (upstream started them at 1.0, so for hundreds of steps the
deltas measured the EMA's drift toward the true entropy, not the policy's dynamics).

"Upstream" is the RED code of CoDA and RED-CoDA (``docs/upstream.md``).

Ablations (``mode``): ``grpo_only`` (SFT weight 0), ``fixed`` (SFT weight = sft_coef), ``red`` (full).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

REDMode = Literal["grpo_only", "fixed", "red"]
DeltaKind = Literal["relative", "absolute"]


class REDConfig(BaseModel):
    """RED: the SFT loss's weight from entropy dynamics and planner accuracy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: REDMode = Field(
        "red", description="SFT weight: none, fixed sft_coef, or RED (entropy change × accuracy factor)"
    )
    g: float = Field(5.0, ge=1, description="RED clamp constant G")
    ema_decay: float = Field(0.99, ge=0, lt=1, description="Decay of the RED entropy EMAs")
    delta: DeltaKind = Field("relative", description="RED entropy-change variant")
    accuracy_aware: bool = Field(True, description="Multiply the RED weight by the accuracy factor")
    accuracy_key: str = Field("f1", description="Reward component scored as accuracy (falls back to reward)")
    accuracy_threshold: float = Field(0.0, description="A planner row is accurate when its score exceeds this")
    floor: float | None = Field(None, description="Lower clamp of the RED weight (None: 1/G²)")

    @property
    def weight_floor(self) -> float:
        return 1.0 / self.g**2 if self.floor is None else self.floor


def clamp(x: float, lo: float, hi: float) -> float:
    return max(lo, min(hi, x))


def entropy_change_weight(
    h_sft_prev: float,
    h_sft: float,
    h_rl_prev: float,
    h_rl: float,
    g: float,
    delta: DeltaKind = "relative",
    eps: float = 1e-8,
) -> float:
    """``w_ent`` (module docstring): SFT entropy change over RL entropy change, clamped to [1, G]."""
    if delta == "relative":
        d_sft, d_rl = abs(1.0 - h_sft / (h_sft_prev + eps)), abs(1.0 - h_rl / (h_rl_prev + eps))
    elif delta == "absolute":
        d_sft, d_rl = abs(h_sft - h_sft_prev), abs(h_rl - h_rl_prev)
    else:
        raise ValueError(f"unknown RED delta {delta!r}")
    return clamp(d_sft / (d_rl + eps), 1.0, g)


def accuracy_factor(accuracy: float, g: float) -> float:
    """``clamp(G^(1 − 2·acc), 1/G, G)``: G at accuracy 0 (more SFT), 1 at 0.5, 1/G at 1 (more RL)."""
    return clamp(g ** (1.0 - 2.0 * accuracy), 1.0 / g, g)


def planner_accuracy(scores: Sequence[float], roles: Sequence[str], threshold: float = 0.0) -> float | None:
    """Share of non-executor rows with ``score > threshold`` (e.g. F1 > 0); None when there is no such row."""
    if len(scores) != len(roles):
        raise ValueError(f"{len(scores)} scores for {len(roles)} roles")
    top = [s for s, r in zip(scores, roles, strict=True) if r != "executor"]
    return sum(s > threshold for s in top) / len(top) if top else None


@dataclass
class REDState:
    """The EMAs (None until the first measurement); lives in checkpoints."""

    h_rl: float | None = None
    h_rl_prev: float | None = None
    h_sft: float | None = None
    h_sft_prev: float | None = None
    steps: int = 0

    def observe(self, h_rl: float | None, h_sft: float | None, decay: float) -> None:
        """Fold this step's measured entropies in (after the update): prev ← EMA; EMA ← β·EMA + (1−β)·H.

        The first measurement of a side seeds both its EMA and its prev with the measured value.
        """
        self.h_rl, self.h_rl_prev = _ema(self.h_rl, h_rl, decay)
        self.h_sft, self.h_sft_prev = _ema(self.h_sft, h_sft, decay)
        self.steps += 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> REDState:
        # Checkpoints written before REDWeights also kept the last weights (``last``), which nothing read back.
        return cls(**{k: v for k, v in data.items() if k != "last"})


@dataclass(frozen=True)
class REDWeights:
    """One step's RED output (module docstring); ``sft_loss_weight`` is the coefficient of the SFT loss.

    ``batch_accuracy`` is None when the step had no planner row; the EMAs are the state's when the weights
    were computed (None until measured).
    """

    entropy_weight: float
    accuracy_factor: float
    final_weight: float
    sft_loss_weight: float
    batch_accuracy: float | None = None
    h_rl: float | None = None
    h_rl_prev: float | None = None
    h_sft: float | None = None
    h_sft_prev: float | None = None


def _ema(current: float | None, measured: float | None, decay: float) -> tuple[float | None, float | None]:
    """(new EMA, new prev) for one side; a missing measurement leaves both untouched."""
    if measured is None:
        return current, current
    if current is None:
        return measured, measured
    return decay * current + (1.0 - decay) * measured, current


def red_weights(
    state: REDState, cfg: REDConfig, accuracy: float | None, sft_coef: float, eps: float = 1e-8
) -> REDWeights:
    """This step's weights from the state (before ``observe``) and the planner accuracy; ``sft_coef`` is the
    trainer's base coefficient of the SFT loss, ``eps`` keeps the entropy-change ratio finite."""
    w_ent, acc_f, final = 1.0, 1.0, 1.0
    if cfg.mode == "red":
        if None not in (state.h_sft, state.h_sft_prev, state.h_rl, state.h_rl_prev):
            w_ent = entropy_change_weight(
                state.h_sft_prev,
                state.h_sft,
                state.h_rl_prev,
                state.h_rl,  # type: ignore[arg-type]
                cfg.g,
                cfg.delta,
                eps,
            )
        if cfg.accuracy_aware and accuracy is not None:
            acc_f = accuracy_factor(accuracy, cfg.g)
        final = clamp(w_ent * acc_f, cfg.weight_floor, cfg.g**2)
    elif cfg.mode not in ("fixed", "grpo_only"):
        raise ValueError(f"unknown RED mode {cfg.mode!r}")
    return REDWeights(
        entropy_weight=w_ent,
        accuracy_factor=acc_f,
        final_weight=final,
        sft_loss_weight=0.0 if cfg.mode == "grpo_only" else sft_coef * final,
        batch_accuracy=accuracy,
        h_rl=state.h_rl,
        h_rl_prev=state.h_rl_prev,
        h_sft=state.h_sft,
        h_sft_prev=state.h_sft_prev,
    )
