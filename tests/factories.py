"""Small builders of valid wire messages for tests."""

from __future__ import annotations

import time

from shared.protocol import Sample, TrajectoryGroup, WeightUpdate


def make_sample(
    sample_id: str = "s0",
    role: str = "policy",
    parent_id: str | None = None,
    prompt: int = 3,
    generated: int = 4,
    reward: float = 1.0,
) -> Sample:
    n = prompt + generated
    return Sample(
        sample_id=sample_id,
        role=role,
        parent_id=parent_id,
        token_ids=list(range(10, 10 + n)),
        prompt_len=prompt,
        loss_mask=[0] * prompt + [1] * generated,
        logprobs=[0.0] * prompt + [-0.5] * generated,
        versions=[-1] * prompt + [2] * generated,
        reward=reward,
        reward_components={"f1": reward},
        num_turns=1,
    )


def make_group(prompt_id: str = "q1", n: int = 2, version: int = 2) -> TrajectoryGroup:
    return TrajectoryGroup(
        prompt_id=prompt_id,
        agent="search-r1",
        data_source="test",
        question="who?",
        golden_answers=["x"],
        policy_version=version,
        samples=[make_sample(f"s{i}", reward=float(i)) for i in range(n)],
        created_at=time.time(),
        timing={"episode_s": 0.5},
        metadata={"seed": 1},
    )


def make_weight_update(version: int = 3) -> WeightUpdate:
    return WeightUpdate(
        version=version,
        kind="lora",
        model_name=f"policy-v{version}",
        path=f"/weights/v{version}",
        step=version,
        created_at=time.time(),
        publish_seconds=0.2,
    )
