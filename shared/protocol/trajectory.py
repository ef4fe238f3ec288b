"""A trajectory group: the ``n`` samples of one prompt, scored, as the rollout publishes it to the trainer.

Token-in/token-out: each sample carries the exact token ids the policy saw and produced, with per-token
loss mask, sampler logprob and policy version, so the trainer never re-tokenises text.

Wire versions of ``TrajectoryGroup`` (``wire_version``): 1 had no such field and named the agent ``recipe``;
2 names it ``agent``. A reader takes both (``recipe`` is read as ``agent``) and writes 2.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

# Which agent role produced a sample. ``policy`` is the flat single-role agent (search-r1, tool-agent).
# The roles are declared by the agents (``Agent.roles``, collected by ``agents.roles()``); shared/ may not import
# agents/, so this closed set, which the trainer validates, lists their names again. A role an agent declares must
# be added here: tests/unit/agents/test_roles.py fails until the two sets agree.
Role = Literal["policy", "planner", "executor", "thinker"]
# The layout TrajectoryGroup writes; see the module docstring for what each version changed.
WIRE_VERSION = 2


class Sample(BaseModel):
    """One token sequence to train on: a flat episode, a planner episode, or one executor sub-episode."""

    model_config = ConfigDict(extra="forbid")

    sample_id: str = Field(description="Unique id of this sample")
    role: Role = Field("policy", description="Agent role that generated the sampled tokens")
    parent_id: str | None = Field(None, description="For an executor: the sample_id of its planner")
    token_ids: list[int] = Field(description="Full sequence: prompt tokens, then generated and inserted tokens")
    prompt_len: int = Field(ge=0, description="Number of leading tokens that are the initial prompt")
    loss_mask: list[int] = Field(description="Per token: 1 only where the trained policy sampled the token")
    logprobs: list[float] = Field(description="Per token: the sampler's logprob (0.0 where loss_mask is 0)")
    versions: list[int] = Field(description="Per token: policy version that sampled it (-1 where loss_mask is 0)")
    reward: float = Field(0.0, description="Scalar reward after combination")
    reward_components: dict[str, float] = Field(default_factory=dict, description="Named reward parts")
    num_turns: int = Field(0, ge=0, description="Policy turns taken")
    finish_reason: str = Field("stop", description="stop | length | budget | error")
    text: str | None = Field(None, description="Decoded text, for debugging and logs only")

    @model_validator(mode="after")
    def _aligned(self) -> Sample:
        n = len(self.token_ids)
        for name in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries for {n} tokens")
        if self.prompt_len > n:
            raise ValueError(f"prompt_len {self.prompt_len} exceeds the {n} tokens")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask entries must be 0 or 1")
        if any(self.loss_mask[: self.prompt_len]):
            raise ValueError("prompt tokens must have loss_mask 0")
        return self

    @property
    def num_trained_tokens(self) -> int:
        return sum(self.loss_mask)

    def min_version(self) -> int | None:
        """Oldest policy version among the trained tokens (None when nothing is trained)."""
        trained = [v for v, m in zip(self.versions, self.loss_mask, strict=True) if m]
        return min(trained) if trained else None


class TrajectoryGroup(BaseModel):
    """All samples of one prompt under a globally unique group id: the GRPO baseline is taken inside it."""

    model_config = ConfigDict(extra="forbid")

    group_id: str = Field(default_factory=lambda: uuid.uuid4().hex, description="Globally unique group id")
    prompt_id: str = Field(description="Dataset id of the prompt")
    agent: str = Field(
        validation_alias=AliasChoices("agent", "recipe"),  # ``recipe``: wire version 1's name
        description="Agent protocol that produced it (search-r1, coda, …: [rollout] agent)",
    )
    data_source: str = Field("", description="Dataset / split the prompt came from")
    question: str = Field("", description="The question or task text")
    golden_answers: list[str] = Field(default_factory=list, description="Reference answers")
    policy_version: int = Field(ge=0, description="Policy version when the group was dispatched")
    samples: list[Sample] = Field(min_length=1, description="The n rollouts (plus executor sub-samples)")
    created_at: float = Field(description="Unix time the group was published")
    timing: dict[str, float] = Field(default_factory=dict, description="Seconds spent per phase")
    metadata: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    wire_version: int = Field(
        WIRE_VERSION,
        ge=1,
        le=WIRE_VERSION,
        description="Layout of the message; one from a newer writer is refused, not misread",
    )

    @model_validator(mode="after")
    def _unique_samples(self) -> TrajectoryGroup:
        ids = [s.sample_id for s in self.samples]
        if len(set(ids)) != len(ids):
            raise ValueError("sample_id values must be unique within a group")
        known = set(ids)
        for s in self.samples:
            if s.parent_id is not None and s.parent_id not in known:
                raise ValueError(f"sample {s.sample_id} names parent {s.parent_id}, which is not in the group")
        return self


# ---------------------------------------------------------------- learning signal
# Whether a trajectory group teaches anything: decided here once, for the trainer and the rollout.
#
# The trainer's group-relative advantage (``services.trainer.rl.advantages``) normalises each *baseline*, a set of
# rows of one group, against its own mean. A baseline whose rows all got the same reward, or that has a single row,
# gets an advantage of exactly 0 on every row: no policy-gradient signal. Which rows share a baseline is the
# trainer's ``role_baseline``:
#
#   inherit:  the group's non-executor rows (executors copy their planner's advantage);
#   per_role: one baseline per role (planners against planners, executors against executors);
#   pooled:   every row of the group.
#
# ``flat`` is the test on one baseline (the trainer's ``zero_variance``, plus singletons); ``has_signal`` says
# whether any baseline of one group is not flat under a mode, or under any mode (``mode=None``). Pure Python,
# so the rollout image (no trainer code) and the trainer share it.

RoleMode = Literal["inherit", "per_role", "pooled"]
ROLE_MODES: tuple[RoleMode, ...] = ("inherit", "per_role", "pooled")


def flat(rewards: Sequence[float]) -> bool:
    """One baseline's rewards give every row an advantage of exactly 0: fewer than two rows, or all equal
    (compared exactly, as the trainer does: any difference, however small, is normalised into a signal)."""
    values = list(rewards)
    return len(values) < 2 or all(v == values[0] for v in values)


def baselines(rewards: Sequence[float], roles: Sequence[str], mode: RoleMode) -> list[list[float]]:
    """The reward sets of ONE group that the trainer normalises separately under ``mode``."""
    if len(rewards) != len(roles):
        raise ValueError(f"{len(rewards)} rewards for {len(roles)} roles")
    if mode == "pooled":
        return [list(rewards)]
    if mode == "inherit":
        return [[r for r, role in zip(rewards, roles, strict=True) if role != "executor"]]
    if mode == "per_role":
        by_role: dict[str, list[float]] = {}
        for r, role in zip(rewards, roles, strict=True):
            by_role.setdefault(role, []).append(r)
        return list(by_role.values())
    raise ValueError(f"unknown role mode {mode!r}")


def has_signal(rewards: Sequence[float], roles: Sequence[str], mode: RoleMode | None = None) -> bool:
    """Whether ONE group gives some row a nonzero advantage under ``mode``; ``None``: under at least one mode
    (the conservative answer for a reader that does not know the trainer's mode: it never calls a group flat
    that the trainer would learn from; since every baseline is a subset of the pooled one, it is the same as
    "not all rewards of the group are equal")."""
    modes = ROLE_MODES if mode is None else (mode,)
    return any(not flat(values) for m in modes for values in baselines(rewards, roles, m))
