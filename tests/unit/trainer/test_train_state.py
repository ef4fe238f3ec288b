"""TrainState's group ledger: a count of every group plus a bounded window of the latest ids, so a checkpoint
stays the same size however long the run; checkpoints written with the old unbounded list still load."""

from __future__ import annotations

import json

from services.trainer.checkpoint import RECENT_GROUPS, TrainState


def test_window_keeps_the_latest_ids_in_order_and_the_count_keeps_going():
    state = TrainState()
    steps = [[f"g{step}-{i}" for i in range(8)] for step in range(RECENT_GROUPS // 8 + 3)]
    for ids in steps:
        state.record_groups(ids)
    every = [g for ids in steps for g in ids]
    assert state.groups_trained == len(every) > RECENT_GROUPS
    assert state.recent_groups == every[-RECENT_GROUPS:]
    again = TrainState.from_json(state.to_json())
    assert again == state and len(json.loads(state.to_json())["recent_groups"]) == RECENT_GROUPS


def test_a_checkpoint_with_the_old_unbounded_ledger_loads():
    every = [f"g{i:05d}" for i in range(RECENT_GROUPS + 10)]
    old = {
        "step": 7,
        "version": 7,
        "tokens": 900,
        "covered": ["5-0"],
        "trained_groups": every,
        "dropped_stale": 2,
        "red": {"steps": 7},
        "sft_cursor": 3,
    }
    state = TrainState.from_json(json.dumps(old))
    assert state.groups_trained == len(every) and state.recent_groups == every[-RECENT_GROUPS:]
    assert (state.step, state.covered, state.dropped_stale, state.red) == (7, ["5-0"], 2, {"steps": 7})
    assert "trained_groups" not in json.loads(state.to_json())
    small = TrainState.from_json(json.dumps({**old, "trained_groups": ["a", "b"]}))
    assert (small.groups_trained, small.recent_groups) == (2, ["a", "b"])
