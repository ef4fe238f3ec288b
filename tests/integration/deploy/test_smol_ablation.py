"""The real-model RED ablations (configs/smol-ablation-*.toml, run by bench/ablation.py): smol-cpu with only
how the demonstrations are used changed, and one budget shared by all four, so the arms differ in nothing else."""

from __future__ import annotations

import tomllib
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
ARM_KEYS = {"trainer": {"red_mode", "sft_only"}}
BUDGET_KEYS = {"stack": {"warm_start_steps", "train_budget_s", "sft_limit"}, "trainer": {"max_steps"}}


def _table(name: str) -> dict:
    return tomllib.loads((CONFIGS / f"{name}.toml").read_text())


def _without(table: dict, keys: dict[str, set[str]]) -> dict:
    return {
        section: {k: v for k, v in body.items() if k not in keys.get(section, set())} for section, body in table.items()
    }


def test_smol_ablations_are_smol_cpu_but_for_the_sft_keys():
    base = _without(
        _table("smol-cpu"), {s: ARM_KEYS.get(s, set()) | BUDGET_KEYS.get(s, set()) for s in ("stack", "trainer")}
    )
    arms = {arm: _table(f"smol-ablation-{arm}") for arm in ("grpo", "sft", "fixed", "red")}
    for arm, table in arms.items():
        assert (
            _without(table, {s: ARM_KEYS.get(s, set()) | BUDGET_KEYS.get(s, set()) for s in ("stack", "trainer")})
            == base
        ), arm
    budgets = {arm: {s: {k: t[s][k] for k in keys} for s, keys in BUDGET_KEYS.items()} for arm, t in arms.items()}
    assert budgets["grpo"] == budgets["sft"] == budgets["fixed"] == budgets["red"]
    trainers = {arm: t["trainer"] for arm, t in arms.items()}
    assert trainers["grpo"]["red_mode"] == "grpo_only" and not trainers["grpo"].get("sft_only", False)
    assert trainers["sft"]["sft_only"] is True and trainers["sft"]["red_mode"] == "fixed"
    assert trainers["fixed"]["red_mode"] == "fixed" and not trainers["fixed"].get("sft_only", False)
    assert trainers["red"]["red_mode"] == "red" and not trainers["red"].get("sft_only", False)
