"""bench/peer_trl.py without running either system: the task it builds from the shipped recipe, how it scores
a run's steps, the run order, and that it rewrites only its own section of peers.md."""

from __future__ import annotations

import tomllib

import pytest


@pytest.fixture(scope="module")
def bench():
    from bench import peer_trl

    return peer_trl


def test_our_recipe_is_the_shipped_one_with_the_task_filled_in(bench, tmp_path):
    # Fails loudly when configs/single-turn.toml changes shape, rather than benching some other task.
    table = tomllib.loads(bench.ours_recipe(tmp_path, 30).read_text())
    assert table["rollout"]["reward"] == "peer_rewards:contains_the"
    assert table["rollout"]["max_tokens_per_turn"] == bench.TASK["max_new_tokens"] == 32
    assert table["rollout"]["n_samples"] == bench.TASK["samples_per_prompt"]
    assert table["shared"]["groups_per_step"] == bench.TASK["prompts_per_step"]
    assert table["trainer"]["max_steps"] == 30
    assert table["trainer"]["lr"] == bench.TASK["lr"]
    namespace: dict = {}
    exec((tmp_path / "peer_rewards.py").read_text(), namespace)
    assert namespace["contains_the"]("over the hill", ["x"], {}) == 1.0
    assert namespace["contains_the"]("a hill", ["x"], {}) == 0.0


def test_steady_state_leaves_out_step_one_and_the_target_needs_a_full_window(bench):
    run = bench.Run("trl", 1)
    rewards = [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    # Step 1 ends 20 s after the start (start-up), then one step every 2 s.
    steps = [{"step": i + 1, "time": 120.0 + 2 * i, "reward": r, "samples": 32} for i, r in enumerate(rewards)]
    bench.score(run, start=100.0, end=150.0, steps=steps)
    assert run.first_step_s == 20.0
    assert run.s_per_step == 2.0
    assert run.samples_per_s == 16.0
    # Trailing 5-step means: 0.2 (step 5), 0.4, 0.6 (step 7) -> reached at step 7, 32 s after the start.
    assert run.to_target_s == 32.0
    assert run.wall_s == 50.0 and run.steps == 10


def test_a_run_that_never_reaches_the_target_says_so(bench):
    run = bench.Run("ours", 1)
    steps = [{"step": i + 1, "time": float(i), "reward": 0.4, "samples": 32} for i in range(8)]
    bench.score(run, start=0.0, end=10.0, steps=steps)
    assert run.to_target_s is None
    assert bench.spread([None, None], "{:.0f}") == "not reached"
    assert "1 of 2 not reached" in bench.spread([3.0, None], "{:.0f}")


def test_runs_alternate_so_each_system_goes_first_in_half_the_pairs(bench):
    assert bench.interleaved(3) == ["ours", "trl", "trl", "ours", "ours", "trl"]


def test_only_the_grpo_section_of_peers_md_is_rewritten(bench, tmp_path):
    peers = tmp_path / "peers.md"
    peers.write_text("# Peer comparisons\n\n## Retriever vs X\n\nkeep me\n")
    bench.write_peers(peers, f"{bench.MARKER} vs TRL\n\nfirst\n")
    bench.write_peers(peers, f"{bench.MARKER} vs TRL\n\nsecond\n")
    text = peers.read_text()
    assert "keep me" in text and "second" in text and "first" not in text
    assert text.count(bench.MARKER) == 1


def test_a_machine_wide_stall_is_named_beside_the_numbers_and_a_rescore_gives_the_same(bench, tmp_path):
    times = [10.0, 12.0, 14.0, 16.0, 216.0, 218.0, 220.0]  # step 5 waited 200 s on a frozen machine
    steps = [{"step": i + 1, "time": t, "reward": 0.6, "samples": 32} for i, t in enumerate(times)]
    run = bench.Run("trl", 1)
    bench.score(run, start=0.0, end=230.0, steps=steps)
    assert [n for n in run.notes if n.startswith("stall:")] == ["stall: step 5 took 200s (median step 2.0s)"]
    assert run.s_per_step == 35.0  # kept in the metric, not trimmed
    again = bench.Run(**bench.asdict(run))
    bench.score(again, again.start, again.start + again.wall_s, again.records)
    assert again == run  # --rescore recomputes from what was saved, without doubling the notes
