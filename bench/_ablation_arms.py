"""The ablation arms: each is a user recipe from configs/ plus overrides, never a copied recipe.

An override is an environment variable ``CODA_<SERVICE>_<KEY>`` (the services' settings read it over the
recipe: docs/configuration.md), so an arm runs alone as its command line says, e.g.

    CODA_TRAINER_RED__MODE=grpo_only CODA_STACK_TRAIN_BUDGET_S=240 CODA_TRAINER_MAX_STEPS=1000 \\
        .venv/bin/python -m launcher train --recipe configs/smol-cpu.toml

``SMOL`` are the arms ``python -m bench.ablation`` runs (the real model on CPU, bench/results/ablation.md);
``RED_CODA`` are the paper-scale RED ablations of CoDA (gemma-2-2b, GPUs: compose with the same variables).
Within a table the arms share their recipe and budget and differ only in how the demonstrations are used.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Arm:
    label: str  # in the report's tables
    recipe: str  # the user recipe it starts from (configs/)
    env: dict[str, str] = field(default_factory=dict)  # its overrides of that recipe

    def command(self) -> str:
        """The arm alone, as ``make train`` runs a recipe."""
        sets = " ".join(f"{k}={v}" for k, v in self.env.items())
        return f"{sets} .venv/bin/python -m launcher train --recipe {self.recipe}".strip()


# One budget for every smol arm: equal wall time after the shared warm start ends an arm, not a step count.
SMOL_BUDGET = {"CODA_STACK_TRAIN_BUDGET_S": "240", "CODA_TRAINER_MAX_STEPS": "1000"}
SMOL = {
    "grpo": Arm("GRPO only", "configs/smol-cpu.toml", {"CODA_TRAINER_RED__MODE": "grpo_only", **SMOL_BUDGET}),
    "sft": Arm(
        "SFT only",
        "configs/smol-cpu.toml",
        {"CODA_TRAINER_RED__MODE": "fixed", "CODA_TRAINER_SFT_ONLY": "true", **SMOL_BUDGET},
    ),
    "fixed": Arm(
        "fixed SFT weight + GRPO", "configs/smol-cpu.toml", {"CODA_TRAINER_RED__MODE": "fixed", **SMOL_BUDGET}
    ),
    "red": Arm("full RED (SFT + GRPO)", "configs/smol-cpu.toml", {"CODA_TRAINER_RED__MODE": "red", **SMOL_BUDGET}),
}

# red-coda.toml at the ablation budget (200 steps, warm-up 0.1 of them); full RED is the recipe as it ships.
RED_CODA_BUDGET = {"CODA_TRAINER_MAX_STEPS": "200", "CODA_TRAINER_WARMUP_STEPS": "20"}
RED_CODA = {
    "grpo": Arm("GRPO only", "configs/red-coda.toml", {"CODA_TRAINER_RED__MODE": "grpo_only", **RED_CODA_BUDGET}),
    "fixed-sft": Arm(
        "fixed SFT weight + GRPO",
        "configs/red-coda.toml",
        {
            "CODA_TRAINER_RED__MODE": "fixed",
            "CODA_TRAINER_RED__G": "1.0",
            "CODA_TRAINER_RED__ACCURACY_AWARE": "false",
            **RED_CODA_BUDGET,
        },
    ),
    "full-red": Arm("full RED (SFT + GRPO)", "configs/red-coda.toml", dict(RED_CODA_BUDGET)),
}
