"""What a run of ``python -m bench.qa`` runs with: an arm's environment checked against the services' settings
before anything starts, and what the bench records of it (CoDA's reward, the trainer's precision, the commit)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import torch

from agents.coda import CoDAParams
from services.rollout.config import RolloutSettings
from services.trainer.config import TrainerSettings
from shared.precision import compute_dtype

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {"CODA_ROLLOUT_": RolloutSettings, "CODA_TRAINER_": TrainerSettings}  # what an arm's env may set


def check_env(recipe: str, env: dict[str, str]) -> None:
    """Refuse an arm's environment that a service would ignore or reject: every ``CODA_ROLLOUT_``/``CODA_TRAINER_``
    name must be a field of that service's settings and its value valid there (pydantic ignores an unknown
    variable silently: an ablation would run as the default and be reported as the ablation)."""
    for name, value in env.items():
        for prefix, settings in SETTINGS.items():
            if not name.startswith(prefix):
                continue
            key = name.removeprefix(prefix).lower()
            table, _, inner = key.partition("__")  # a nested table's key: CODA_ROLLOUT_CODA__REWARD_MODE
            field = settings.model_fields.get(table)
            known = field is not None and (not inner or inner in getattr(field.annotation, "model_fields", {}))
            if not known:
                raise SystemExit(f"{name}: {settings.__name__} has no setting {key!r} (recipe {recipe})")
            try:
                settings.load(recipe, **({table: {inner: value}} if inner else {key: value}))
            except ValueError as exc:
                raise SystemExit(f"{name}={value}: {settings.__name__} refuses it:\n{exc}") from None


def coda_reward(recipe: str, env: dict[str, str]) -> str:
    """The reward a CoDA run trains with, ``reward_mode / role_baseline`` (the rollout's and the trainer's: the
    arm's environment over --set over the recipe); recorded with the run (the arm ``coda`` had the shared reward
    before the recipes made the per-role one their default)."""
    mode = env.get("CODA_ROLLOUT_CODA__REWARD_MODE")
    rollout = RolloutSettings.load(recipe, coda={"reward_mode": mode} if mode else None)
    trainer = TrainerSettings.load(recipe, role_baseline=env.get("CODA_TRAINER_ROLE_BASELINE"))
    return f"{CoDAParams.of(rollout).reward_mode} / {trainer.role_baseline}"


def commit() -> str:
    """The commit the run measured (recipes change between runs: the report names what each row ran)."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "configs"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() + ("+configs" if dirty.stdout.strip() else "")


def matmul_precision(recipe: str, sets: list[str]) -> str:
    """What the trainer computed in: its ``precision`` (--set over the trainer's own settings: environment,
    recipe, default) resolved on this CPU. auto means bf16 autocast on a CPU that multiplies bf16 natively
    (shared.precision), and that alone changes the seconds of a step several-fold between machines."""
    named = dict(pair.split("=", 1) for pair in sets)
    precision = TrainerSettings.load(recipe, precision=named.get("CODA_TRAINER_PRECISION")).precision
    return "bf16" if compute_dtype(precision, "cpu") == torch.bfloat16 else "fp32"
