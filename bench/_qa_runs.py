"""Pieces of ``python -m bench.qa`` beside the stack: an arm's environment for the stack object, the few-shot system
turn of an untrained arm, and what a run's trainer log says of its steps."""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from pathlib import Path

from agents.answers import as_gold_list
from agents.datasets import load_prompts, question_type, select_split
from bench._qa_arms import DATASETS
from launcher import read_log


@contextlib.contextmanager
def environment(env: dict[str, str]):
    """``env`` over ``os.environ`` for the duration (put back after)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def few_shot_prompt(dataset: str, shots: int) -> str:
    """A system turn with ``shots`` training questions of ``dataset`` and their gold answers, one of each question
    type in turn (the first of each): examples of the short answer the metric wants, never a held-out question."""
    by_type: dict[str, list] = {}
    for r in select_split(load_prompts(DATASETS[dataset]), "train"):
        by_type.setdefault(question_type(r), []).append(r)
    rounds = itertools.zip_longest(*by_type.values())
    train = [r for row in rounds for r in row if r is not None][:shots]
    examples = "\n".join(f"Question: {r.question}\nAnswer: {as_gold_list(r.golden_answers)[0]}" for r in train)
    return f"Answer in a few words, like these examples.\n{examples}"


def step_stats(log_file: Path) -> dict:
    """Steps made; seconds per RL step, wall (between consecutive RL steps' records: waiting for rollouts
    included) and the trainer's own compute; the reward of the first and last steps; the share of groups with
    a learning signal."""
    rows = [r for r in read_log(log_file) if "step" in r]
    rl = [r for r in rows if "reward_mean" in r]
    rewards = [r["reward_mean"] for r in rl]
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(rl) if b["step"] == a["step"] + 1]
    compute = [r["step_seconds"] for r in rl if "step_seconds" in r]
    groups = sum(r.get("groups", 0) for r in rl if "zero_variance_groups" in r)
    flat = sum(r["zero_variance_groups"] for r in rl if "zero_variance_groups" in r)
    return {
        # Groups whose rewards differ: the only ones GRPO learns from (all right or all wrong: advantage 0).
        "signal_share": 1 - flat / groups if groups else None,
        "steps": len(rows),
        "rl_steps": len(rl),
        "s_per_rl_step": sum(gaps) / len(gaps) if gaps else None,
        "compute_s_per_rl_step": sum(compute) / len(compute) if compute else None,
        "reward_first": sum(rewards[:5]) / len(rewards[:5]) if rewards else None,
        "reward_last": sum(rewards[-5:]) / len(rewards[-5:]) if rewards else None,
    }


def say(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, flush=True)
