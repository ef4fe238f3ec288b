"""What ``make train`` prints: progress lines from the trainer's JSONL log (``TrainingWatch`` while a trainer runs)
and the before/after summary."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.progress import Pace, pace_text

# Metrics of the greedy eval shown side by side (those the eval reports; missing ones are left out). ``reward``:
# the recipe's own reward of each greedy episode, what a user reward with no gold answers is judged by.
EVAL_METRICS = ("search_entity", "search_hit", "em", "f1", "reward")


@dataclass
class EvalResult:
    path: Path
    n: int
    metrics: dict[str, float] = field(default_factory=dict)
    failed: int = 0

    def headline(self) -> str:
        parts = [f"{k}={v:.3f}" for k, v in self.metrics.items()]
        return f"{self.n} held-out prompts, " + " ".join(parts) + (f", {self.failed} failed" if self.failed else "")


def read_eval(folder: Path) -> EvalResult:
    """The newest eval JSON in ``folder`` (``python -m services.rollout eval`` writes one per run)."""
    files = sorted(Path(folder).glob("*.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise FileNotFoundError(f"no eval result in {folder}")
    doc = json.loads(files[-1].read_text())
    overall = doc["by_source"].get("ALL") or next(iter(doc["by_source"].values()))
    metrics = {k: float(overall[k]) for k in EVAL_METRICS if k in overall}
    return EvalResult(path=files[-1], n=int(overall["n"]), metrics=metrics, failed=int(doc.get("failed", 0)))


def read_log(log_file: Path) -> list[dict]:
    """The trainer's JSONL log (``train.jsonl``), one dict a step; [] before it exists."""
    if not log_file.is_file():
        return []
    rows = []
    for line in log_file.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written right now
            continue
    return rows


def step_time(log_file: Path, index: int) -> float | None:
    """When the ``index``-th logged step (0-based) finished, as the trainer recorded it; None before it is
    logged (its record's ``time``, else now: the record was just seen)."""
    rows = read_log(log_file)
    if len(rows) <= index:
        return None
    landed = rows[index].get("time")
    return float(landed) if isinstance(landed, int | float) else time.time()


def _window_mean(rows: list[dict], key: str, first: bool, width: int = 5) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    if not values:
        return None
    part = values[:width] if first else values[-width:]
    return sum(part) / len(part)


def training_progress(log_file: Path, max_steps: int, elapsed_s: float, pace: Pace | None = None) -> tuple[int, str]:
    """(last step logged, a progress line); with ``pace``: steps/s and the ETA too."""
    rows = read_log(log_file)
    if not rows:
        return 0, f"training: waiting for the first step ({elapsed_s:.0f}s)"
    last = rows[-1]
    step = int(last.get("step", len(rows)))
    parts = [f"step {step}/{max_steps or '∞'}", f"{elapsed_s:.0f}s"]
    if pace is not None:
        parts.append(pace_text(*pace.update(step, time.monotonic())))
    for key in ("reward_mean", "reward/f1", "loss", "sft_loss", "red/sft_loss_weight"):
        if isinstance(last.get(key), int | float):
            parts.append(f"{key}={last[key]:.3f}")
    return step, "training: " + " ".join(parts)


class TrainingWatch:
    """Polled every second while a trainer runs (``on_tick`` of ``Supervisor.wait_for``), so that the first step
    is noticed when it lands: says so once per stack and runs ``on_first_step``, ticks the alert monitor (a
    firing alert is said above the live line), and refreshes the status line at its own pace (``tick_s``: a
    plain line every 15 s off a terminal), with what is left of the budget when one ends the run."""

    def __init__(
        self,
        stack: Any,  # the ``LocalStack``: its ``say``, start time, processes and first-step flag
        log_file: Path,
        max_steps: int,
        start: float,
        budget_s: float | None,
        tick_alerts: Callable[[], None],
        on_first_step: Callable[[], None] | None = None,
    ) -> None:
        self.stack, self.log_file, self.max_steps, self.start = stack, log_file, max_steps, start
        self.budget_s, self.tick_alerts, self.on_first_step = budget_s, tick_alerts, on_first_step
        self.pace = Pace(max_steps)
        self.first_step: float | None = None
        self.resumed_at = len(read_log(log_file)) if log_file.is_file() else 0
        self.last_status = time.monotonic()

    def __call__(self) -> None:
        stack = self.stack
        if self.first_step is None and (landed := step_time(self.log_file, self.resumed_at)) is not None:
            self.first_step = landed
            if not stack.first_step_said:
                stack.first_step_said = True
                stack.say(
                    f"first step done {landed - stack.started:.0f}s after the start "
                    f"({landed - self.start:.0f}s after the trainer started)"
                )
            if self.on_first_step is not None:
                self.on_first_step()
        self.tick_alerts()
        if time.monotonic() - self.last_status < stack.processes.tick_s:
            return
        self.last_status = time.monotonic()
        _, line = training_progress(self.log_file, self.max_steps, time.time() - self.start, self.pace)
        if self.budget_s:  # the budget ends this run, not max_steps: say how much of it is left
            left = max(0.0, self.budget_s - (time.time() - self.start)) / 60
            line = re.sub(r"  ETA \S+", f"  budget left {left:.1f} min", line)
        stack.processes.status(line)


def render_summary(
    run: Path,
    before: EvalResult | None,
    after: EvalResult | None,
    seconds: float,
    warm: tuple[int, EvalResult | None] | None = None,
    alerts: list[str] | None = None,
) -> str:
    """The closing table: the step-0 eval, the warm start's (``(its step, its eval)``, when the run had one:
    what the demonstrations alone gave) and the end's, side by side. Evals are None when the held-out eval is
    off (``[stack] eval_limit = 0``): the table then holds the training reward alone. ``alerts``: the lines
    of what the RL-health alerts said (``launcher.alerts.monitor.summary_lines``)."""
    rows = read_log(run / "trainer" / "train.jsonl")
    steps = int(rows[-1].get("step", len(rows))) if rows else 0
    columns = [
        ("step 0", before),
        *([(f"warm start (step {warm[0]})", warm[1])] if warm else []),
        (f"step {steps}", after),
    ]
    evals = [result for _, result in columns if result is not None]
    title = f"greedy eval, held-out ({evals[-1].n} prompts)" if evals else "no held-out eval ([stack] eval_limit = 0)"
    lines = [
        "",
        "=" * 64,
        f"make train finished in {seconds / 60:.1f} min ({steps} optimizer steps)",
        "",
        f"| {title} | " + " | ".join(name for name, _ in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for key in EVAL_METRICS:
        if any(key in result.metrics for result in evals):
            values = [_fmt(r.metrics.get(key) if r is not None else None) for _, r in columns]
            label = "reward (the recipe's, greedy)" if key == "reward" else key
            lines.append(f"| {label} | " + " | ".join(values) + " |")
    r0, r1 = _window_mean(rows, "reward_mean", True), _window_mean(rows, "reward_mean", False)
    # After a warm start the first rewarded steps come after it: their mean goes in its column.
    first = f"— | {_fmt(r0)}" if warm else _fmt(r0)
    lines.append(f"| training reward (mean of first/last 5 steps) | {first} | {_fmt(r1)} |")
    lines += [
        "",
        *(alerts or []),
        f"plots:       {run / 'trainer'}/*.png",
        f"checkpoints: {run / 'checkpoints'}",
        *[f"{'evals:' if i == 0 else '':<13}{r.path}" for i, r in enumerate(evals)],
        f"logs:        {run / 'logs'}",
        "=" * 64,
    ]
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"
