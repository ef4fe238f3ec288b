"""What a run of ``python -m bench.qa`` runs with: its command line (``arguments``), an arm's environment
checked against the services' settings before anything starts, and what the bench records of it (CoDA's reward,
the trainer's precision, the commit)."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import torch

from agents.coda import CoDAParams
from bench._qa_arms import DATASETS, METHODS
from services.rollout.config import RolloutSettings
from services.trainer.config import TrainerSettings
from shared.precision import compute_dtype

ROOT = Path(__file__).resolve().parent.parent
SEARCHERS = ("coda-sft", "sft", "base")  # --searcher: the arm whose final adapter the searcher is, or base
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


def arguments(description: str) -> argparse.ArgumentParser:
    """The command line of ``python -m bench.qa``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default="runs/qa", help="where the runs are written")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="one run of each trained method per seed")
    p.add_argument("--train-s", type=float, default=600.0, help="training wall time of each trained run")
    p.add_argument(
        "--warm-steps",
        type=int,
        default=0,
        help="SFT-only steps before GRPO + RED (inside --train-s; 0: each recipe's warm_start_steps)",
    )
    p.add_argument(
        "--searcher",
        default=SEARCHERS[0],
        choices=SEARCHERS,
        help="thinker-searcher's frozen searcher: the final adapter of this arm's run of the same dataset and seed "
        "(under --root; run first when both are named), or base: the untrained model",
    )
    p.add_argument(
        "--limit",
        type=int,
        default=150,
        help="evaluate the first N held-out questions (default 150: all 312 take 8-10 min a method here; 0: all)",
    )
    p.add_argument("--fresh", action="store_true", help="forget qa.json.xz's runs and measure them again")
    p.add_argument(
        "--again",
        action="store_true",
        help="measure the runs these --datasets/--methods/--seeds name again, keeping qa.json.xz's others",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for every service of the runs, as an environment variable over the recipes (e.g. "
        "CODA_TRAINER_ADVANTAGE=dr_grpo); recorded with each run; use with --name to keep qa.json.xz's arms apart",
    )
    p.add_argument(
        "--snapshot-every-s",
        type=float,
        default=300.0,
        help="keep a trained arm's adapter every this many seconds of training (and at the end of its warm start "
        "and of its training) for --curve; 0: only those two",
    )
    p.add_argument(
        "--curve",
        action="store_true",
        help="after each trained run (measured now or before), evaluate its kept adapters on --curve-limit "
        "open-answer held-out questions, outside the training budget, and draw bench/results/CURVE_NAME.png",
    )
    p.add_argument("--curve-limit", type=int, default=40, help="open-answer held-out questions a curve point asks")
    p.add_argument(
        "--curve-name", default="qa-curve", help="stem of the curve's plot and raw numbers under bench/results"
    )
    p.add_argument("--report-only", action="store_true", help="rewrite NAME.md from NAME.json.xz")
    p.add_argument("--name", default="qa", help="results file stem under bench/results (default: qa)")
    return p
