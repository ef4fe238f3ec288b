"""The per-step record (its line of train.jsonl) from typed step results, and the sums a step result carries.

The expected dicts are written out by hand: they are the keys bench/, the stack's report, the dashboards and
the integration tests read (the RL step's dict is what the record looked like before the step results were
typed).
"""

from __future__ import annotations

import pytest

from services.trainer.checkpoint import TrainState
from services.trainer.metrics import RlMetrics, line
from services.trainer.rl.red import REDWeights
from services.trainer.step import RlSums, StepMetrics, StepResult
from services.trainer.step_record import Rollouts, step_record
from shared.protocol import Sample, TrajectoryGroup, WeightUpdate
from shared.stream import QueueStats

# Two RL micro-batches as Objective reports them (local means and shares of the loss, their trained tokens).
PARTS = [
    (RlMetrics(pg_loss=0.25, loss=0.5, clip_fraction=0.5, ratio_mean=1.5, staleness_mean=1.0), 30.0),
    (RlMetrics(pg_loss=0.125, loss=0.25, clip_fraction=0.0, ratio_mean=1.0, staleness_mean=0.0), 10.0),
]
STATE = TrainState(step=7, version=4, tokens=1000, dropped_stale=5)


def _rl_sums() -> RlSums:
    rl = RlSums()
    for metrics, tokens in PARTS:
        rl += RlSums.of(metrics, tokens)
    return rl


def _result(metrics: StepMetrics, **kw) -> StepResult:
    fields = {
        "rl_tokens": 40.0,
        "rl_sequences": 4.0,
        "sft_tokens": 10.0,
        "sft_weight": 0.3,
        "rl_micro_batches": 2,
        "sft_micro_batches": 1,
        "grad_norm": 0.5,
        "lr": 1e-3,
        "seconds": 2.0,
    }
    return StepResult(metrics, **{**fields, **kw})


def _groups() -> list[TrajectoryGroup]:
    out = []
    for i, (rewards, version) in enumerate([([1.0, 0.0], 3), ([0.5, 0.5], 1)]):
        samples = [
            Sample(
                sample_id=f"s{j}",
                token_ids=[1, 2, 3],
                prompt_len=1,
                loss_mask=[0, 1, 1],
                logprobs=[0.0, -1.0, -1.0],
                versions=[-1, version, version],
                reward=r,
                reward_components={"f1": r / 2},
            )
            for j, r in enumerate(rewards)
        ]
        out.append(
            TrajectoryGroup(
                group_id=f"g{i}", prompt_id=f"p{i}", agent="t", policy_version=version, samples=samples, created_at=0
            )
        )
    return out


def test_rl_step_record_is_the_hand_written_dict():
    metrics = StepMetrics(_rl_sums(), rl_entropy_sum=60.0, sft_entropy_sum=20.0, sft_loss_sum=25.0, tokens=100.0)
    red = REDWeights(2.0, 1.5, 3.0, 0.3, batch_accuracy=0.25, h_rl=1.2, h_rl_prev=1.1, h_sft=0.9, h_sft_prev=0.8)
    rollouts = Rollouts(
        _groups(),
        zero_variance_groups=1,
        dropped_stale=2,
        skipped_zero_advantage=1,
        queue=QueueStats(depth=9, pending=3, lag=2, dead_letters=0),
    )
    publish = WeightUpdate(
        version=4, kind="lora", model_name="policy-v4", path="/w", step=7, created_at=0, publish_seconds=0.75
    )
    rec = step_record(_result(metrics), STATE, 2.5, red=red, rollouts=rollouts, publish=publish, sync_diff=1e-5)
    assert line(rec) == {
        # the RL objective's metrics: token-weighted means ((0.5·30 + 0·10) / 40 ...), shares summed
        "clip_fraction": 0.375,
        "ratio_mean": 1.375,
        "staleness_mean": 0.75,
        "pg_loss": 0.375,
        "loss": 0.75,
        # the step
        "tokens": 100.0,
        "rl_entropy": 1.5,  # 60 / 40 RL tokens
        "sft_entropy": 2.0,  # 20 / 10 demonstration tokens
        "sft_loss": 2.5,  # 25 / 10
        "rl_tokens": 40.0,
        "rl_sequences": 4.0,
        "sft_tokens": 10.0,
        "micro_batches": 3.0,
        "grad_norm": 0.5,
        "lr": 1e-3,
        "seconds": 2.0,
        "tokens_per_second": 50.0,  # 100 tokens in the step's 2 s of compute
        "step": 7,
        "version": 4,
        "step_seconds": 2.5,
        "total_tokens": 1000,
        # RED
        "red/entropy_weight": 2.0,
        "red/accuracy_factor": 1.5,
        "red/final_weight": 3.0,
        "red/sft_loss_weight": 0.3,
        "red/batch_accuracy": 0.25,
        "red/h_rl": 1.2,
        "red/h_rl_prev": 1.1,
        "red/h_sft": 0.9,
        "red/h_sft_prev": 0.8,
        # the rollouts
        "reward/f1": 0.25,
        "reward_mean": 0.5,
        "reward_std": pytest.approx(0.5**0.5 / 2),  # rewards 1, 0, 0.5, 0.5: population σ
        "groups": 2,
        "zero_variance_groups": 1,
        "signal_share": 0.5,  # 1 − 1 / 2 groups
        "dropped_stale": 5,
        "dropped_stale_step": 2,
        "skipped_zero_advantage": 1,
        "staleness_max": 3,  # version 4, oldest group from version 1
        "queue_lag": 2,
        "queue_pending": 3,
        # the publish
        "publish_seconds": 0.75,
        "sync_max_abs_diff": 1e-5,
    }


def test_sft_only_step_record_is_the_hand_written_dict():
    metrics = StepMetrics(RlSums(), sft_entropy_sum=20.0, sft_loss_sum=25.0, tokens=50.0)
    result = _result(metrics, rl_tokens=0.0, rl_sequences=0.0, sft_weight=1.0, rl_micro_batches=0)
    assert line(step_record(result, STATE, 2.5)) == {
        "tokens": 50.0,
        "sft_entropy": 2.0,
        "sft_loss": 2.5,
        "rl_tokens": 0.0,
        "rl_sequences": 0.0,
        "sft_tokens": 10.0,
        "micro_batches": 1.0,
        "grad_norm": 0.5,
        "lr": 1e-3,
        "seconds": 2.0,
        "red/sft_loss_weight": 1.0,  # the coefficient it trained with, without RED
        "groups": 0,
        "step": 7,
        "version": 4,
        "step_seconds": 2.5,
        "tokens_per_second": 25.0,
        "total_tokens": 1000,
    }


def test_rl_step_without_demonstrations_has_no_red_or_sft_keys():
    metrics = StepMetrics(_rl_sums(), rl_entropy_sum=60.0, tokens=80.0)
    result = _result(metrics, sft_tokens=0.0, sft_weight=0.0, sft_micro_batches=0)
    rollouts = Rollouts(_groups(), 0, 0, 0, QueueStats(depth=0, pending=0, lag=0, dead_letters=0))
    rec = line(step_record(result, STATE, 2.5, rollouts=rollouts))
    assert not [k for k in rec if k.startswith("red/") or k in ("sft_loss", "sft_entropy", "publish_seconds")]
    assert rec["rl_entropy"] == 1.5 and rec["sft_tokens"] == 0.0 and rec["groups"] == 2


def test_means_of_a_side_that_did_not_train_are_none():
    metrics = StepMetrics(RlSums(), sft_entropy_sum=0.0, sft_loss_sum=0.0, tokens=0.0)
    # Demonstrations given with weight 0 are not run: their tokens are counted, not trained.
    result = _result(metrics, rl_tokens=0.0, sft_micro_batches=0)
    assert (result.rl_entropy(), result.sft_entropy(), result.sft_loss()) == (None, None, None)
    assert result.sft_trained_tokens == 0.0 and not result.trained


def test_total_over_ranks_lines_up_metrics_by_field():
    # Two ranks whose micro-batches measured the same metrics; one metric no rank measured (kl) stays None.
    a, b = StepMetrics(tokens=10.0, rl_entropy_sum=1.0), StepMetrics(tokens=30.0, sft_loss_sum=4.0)
    a.rl += RlSums.of(RlMetrics(clip_fraction=1.0, ratio_mean=2.0, pg_loss=0.5), 1.0)
    b.rl += RlSums.of(RlMetrics(pg_loss=0.25, ratio_mean=1.0, clip_fraction=0.0), 3.0)
    seen: list[list[float]] = []
    b.total(lambda values: seen.append(values) or values)  # what rank b puts into the all-reduce
    total = a.total(lambda values: [x + y for x, y in zip(values, seen[0], strict=True)])
    assert total == StepMetrics(
        RlSums(RlMetrics(pg_loss=0.75, clip_fraction=1.0, ratio_mean=5.0), tokens=4.0),
        rl_entropy_sum=1.0,
        sft_loss_sum=4.0,
        tokens=40.0,
    )
    assert total.rl.means() == RlMetrics(clip_fraction=0.25, ratio_mean=1.25, pg_loss=0.75)
