"""Every shipped recipe trains for 2 steps on CPU with the tiny model, through the real services."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.report import read_log
from shared.protocol import WeightUpdate
from shared.stream import StreamQueue

REPO = Path(__file__).resolve().parents[2]
# Every recipe, one per agent in agents.AGENTS included, trains here (the ablation arms are no recipes:
# bench/_ablation_arms.py overrides smol-cpu and red-coda).
RECIPES = sorted(p.name for p in (REPO / "configs").glob("*.toml"))

# Shrink a recipe to a smoke run: 2 optimizer steps of 1 group of 2 short episodes each.
SMOKE = {
    "CODA_TRAINER_MAX_STEPS": "2",
    "CODA_TRAINER_GROUPS_PER_STEP": "1",
    "CODA_ROLLOUT_GROUPS_PER_STEP": "1",
    "CODA_ROLLOUT_N_SAMPLES": "2",
    "CODA_ROLLOUT_MAX_TOKENS_PER_TURN": "12",
    "CODA_ROLLOUT_MAX_OBS_TOKENS": "48",
    "CODA_ROLLOUT_MAX_CONTEXT_TOKENS": "900",
    "CODA_ROLLOUT_RECURSIVE_REASONER__WORKER_MAX_TOKENS": "12",
    "CODA_ROLLOUT_MAX_RUNNING_GROUPS": "2",
    "CODA_TRAINER_WARMUP_STEPS": "0",
    "CODA_TRAINER_MICRO_BATCH_TOKENS": "4096",
    "CODA_TRAINER_CHECKPOINT_EVERY": "1",
}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_trains_two_steps(local_stack, recipe):
    stack, sup, sft = local_stack
    redis = stack_redis(stack)
    redis.flushall()  # each recipe starts from version 0 with empty streams
    # The real-model recipes skip zero-advantage samples: without demonstrations an untrained smoke run whose
    # rewards are all equal would make no step.
    uses_sft = recipe.startswith(("red-coda", "smol-")) or recipe == "tiny-cpu.toml"
    log = stack.train(
        sup, sft if uses_sft else None, recipe=str(REPO / "configs" / recipe), tag=Path(recipe).stem, **SMOKE
    )
    rows = read_log(log)
    assert [int(r["step"]) for r in rows] == [1, 2]
    # Every step took its RL samples: trained, or (zero_advantage) left out for having no advantage.
    assert all("reward_mean" in r and r["rl_sequences"] + r.get("skipped_zero_advantage", 0) >= 2 for r in rows)
    if recipe in ("red-coda.toml", "tiny-cpu.toml") or recipe.startswith("smol-"):
        assert all(r["sft_tokens"] > 0 for r in rows)
    events = StreamQueue(redis, "weights", WeightUpdate).r.xrange("weights")
    assert len(events) >= 2  # the initial weights and at least the last step's were published
    assert int(redis.get("policy:version")) >= 2
    stats = redis.xinfo_groups("trajectories")[0]
    assert int(stats["pending"]) == 0  # every consumed group was acknowledged after its checkpoint


def stack_redis(stack):
    import redis

    return redis.Redis(port=stack.ports.redis)
