"""bench/peer_trl.py's measurements and report: a run's record (``Run``), the process-tree sampler, scoring from
per-step records, and the GRPO section of ``bench/results/peers.md``."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

MARKER = "## GRPO end to end"
TASK = {
    "prompts_per_step": 8,
    "samples_per_prompt": 4,
    "max_new_tokens": 32,
    "temperature": 1.0,
    "lr": 3e-3,
    "warmup_steps": 2,
    "clip_low": 0.2,
    "clip_high": 0.28,
    "grad_clip": 1.0,
    "seed": 0,
}
WINDOW = 5  # steps in the moving average of the reward
TARGET = 0.5


@dataclass
class Run:
    system: str  # "ours" | "trl"
    rep: int
    ok: bool = False
    wall_s: float = 0.0
    first_step_s: float | None = None  # command start -> end of step 1
    samples_per_s: float | None = None  # steps 2..N
    s_per_step: float | None = None
    to_target_s: float | None = None  # command start -> trailing 5-step mean reward >= 0.5
    peak_rss_mb: float = 0.0
    peak_rss_by_service: dict[str, float] = field(default_factory=dict)  # MB, each service's own peak
    reward_first5: float | None = None
    reward_last5: float | None = None
    steps: int = 0
    log: str = ""
    notes: list[str] = field(default_factory=list)
    start: float = 0.0  # wall clock at launch; with ``records`` (per step: step, time, reward, samples) it
    records: list[dict] = field(default_factory=list)  # lets --rescore recompute every metric later


SERVICES = ("trainer", "inference", "rollout", "retriever", "searcher", "redis", "stack", "tools")
# What a process's command line holds, per name of SERVICES: "stack" is the launcher (make train), "tools" a
# data or model tool it runs (make_sft, import_gguf).
_MARKS = {"redis": "redis", "stack": "-m launcher", "tools": "-m tools."}


def service_of(cmdline: list[str]) -> str:
    """Which of our services a process of the tree is (by its command line); "other" for the rest (TRL's one
    process, a helper)."""
    text = " ".join(cmdline)
    for name in SERVICES:
        if _MARKS.get(name, f"services.{name}") in text:
            return name
    return "other"


def tree_rss(pid: int, by_service: dict[str, int] | None = None) -> int:
    """Summed RSS (bytes) of a process and all its descendants now; 0 once it has exited. ``by_service`` gets
    the same sum per service (``service_of``)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):  # exited since listed
            rss = p.memory_info().rss
            total += rss
            if by_service is not None:
                name = service_of(p.cmdline())
                by_service[name] = by_service.get(name, 0) + rss
    return total


class TreeSampler(threading.Thread):
    """Peak summed RSS of a process and all its descendants, and the highest 1-min load average seen."""

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.every_s = pid, every_s
        self.peak = 0
        self.peaks: dict[str, int] = {}  # per service (service_of): the highest sum seen
        self.load_max = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            now: dict[str, int] = {}
            self.peak = max(self.peak, tree_rss(self.pid, now))
            for name, rss in now.items():
                self.peaks[name] = max(self.peaks.get(name, 0), rss)
            self.load_max = max(self.load_max, os.getloadavg()[0])
            self.done.wait(self.every_s)


def launch(
    cmd: list[str], env: dict[str, str], log: Path, cwd: Path, timeout_s: float, peaks: dict | None = None
) -> tuple[float, int, float, float]:
    """Run ``cmd`` to the end; returns (start time, exit code, peak tree RSS in MB, highest load seen).
    ``peaks`` gets each service's peak RSS in MB (``service_of``)."""
    with open(log, "w") as fh:
        start = time.time()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        sampler = TreeSampler(proc.pid)
        sampler.start()
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # Only this run's own process group: the stack's services run in it too.
            os.killpg(proc.pid, 15)
            code = proc.wait(timeout=60)
        sampler.done.set()
        sampler.join()
    if peaks is not None:
        peaks.update({name: rss / 2**20 for name, rss in sampler.peaks.items()})
    return start, code, sampler.peak / 2**20, sampler.load_max


ROOT = Path(__file__).resolve().parents[1]


def clean_env() -> dict[str, str]:
    """The caller's environment without anything that would tune either side: thread counts and our own
    CODA_* overrides are left to each system's defaults."""
    drop = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TORCH_NUM_THREADS", "PYTHONPATH")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("CODA_")}


def run_stack(
    run: Run, recipe: Path, pythonpath: Path, run_root: Path, log: Path, timeout_s: float
) -> tuple[float, float, int, float, Path | None]:
    """Our side of a run: ``launcher train --new`` on ``recipe`` (``pythonpath`` holds its reward module),
    timed by ``launch``; fills ``run.log``, ``peak_rss_mb`` and ``ok``. Returns (start, end, exit code, highest
    load, the run folder it made or None)."""
    before = set(run_root.glob("*")) if run_root.exists() else set()
    env = {**clean_env(), "PYTHONPATH": os.pathsep.join([str(pythonpath), str(ROOT)])}
    cmd = [sys.executable, "-m", "launcher", "train", "--recipe", str(recipe), "--new"]
    start, code, rss, load = launch(
        [*cmd, "--run-root", str(run_root)], env, log, ROOT, timeout_s, peaks=run.peak_rss_by_service
    )
    end = time.time()
    run.log, run.peak_rss_mb, run.ok = str(log), rss, code == 0
    folders = sorted(set(run_root.glob("*")) - before)
    return start, end, code, load, folders[-1] if folders else None


def trainer_records(folder: Path | None) -> list[dict]:
    """Our trainer's per-step log as ``score`` reads it (``step``, ``time``, ``reward``, ``samples``), plus
    ``dropped_stale``; empty when the run wrote none."""
    path = folder / "trainer" / "train.jsonl" if folder else None
    if path is None or not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        out.append(
            {
                "step": r["step"],
                "time": r["time"],
                "reward": r["reward_mean"],
                # The samples the step took: trained, or left out of the forward/backward for having no
                # advantage (zero_advantage = "skip": the gradient is the same as if they had been run).
                "samples": r.get("rl_sequences", 32) + r.get("skipped_zero_advantage", 0),
                "dropped_stale": r.get("dropped_stale", 0),
            }
        )
    return out


def json_lines(log: Path) -> dict:
    """The JSON objects a script printed on lines of their own (TRL's versions and threads), merged."""
    info: dict = {}
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                info.update(json.loads(line))
    return info


def score(run: Run, start: float, end: float, steps: list[dict], target: float = TARGET) -> None:
    """Fill the timing and reward metrics from per-step records (``step``, ``time``, ``reward``, ``samples``);
    ``to_target_s``: the first step whose trailing ``WINDOW``-step mean reward is ≥ ``target``."""
    steps = sorted(steps, key=lambda r: r["step"])
    run.start, run.records = start, steps
    run.steps = len(steps)
    run.wall_s = end - start
    if not steps:
        return
    run.first_step_s = steps[0]["time"] - start
    if len(steps) >= 2:
        span = steps[-1]["time"] - steps[0]["time"]
        run.samples_per_s = sum(r["samples"] for r in steps[1:]) / span
        run.s_per_step = span / (len(steps) - 1)
        # A shared machine can freeze every process for minutes; such a step is not either system's pace, so
        # the run says so next to its numbers (the metrics keep it: no silent trimming).
        gaps = [(b["time"] - a["time"], b["step"]) for a, b in itertools.pairwise(steps)]
        typical = statistics.median(g for g, _ in gaps)
        longest, at = max(gaps)
        run.notes = [n for n in run.notes if not n.startswith("stall:")]
        if longest > 30 and longest > 5 * typical:
            run.notes.append(f"stall: step {at} took {longest:.0f}s (median step {typical:.1f}s)")
    rewards = [r["reward"] for r in steps]
    run.reward_first5 = statistics.fmean(rewards[:WINDOW])
    run.reward_last5 = statistics.fmean(rewards[-WINDOW:])
    for i in range(WINDOW - 1, len(steps)):
        if statistics.fmean(rewards[i - WINDOW + 1 : i + 1]) >= target:
            run.to_target_s = steps[i]["time"] - start
            break


METRICS = [
    ("samples_per_s", "steady-state trained samples/s", "{:.1f}", "higher"),
    ("s_per_step", "steady-state s/step", "{:.2f}", "lower"),
    ("to_target_s", "start → 5-step mean reward ≥ 0.5 (s)", "{:.0f}", "lower"),
    ("first_step_s", "start → first step done (s)", "{:.0f}", "lower"),
    ("peak_rss_mb", "peak RSS, process tree (MB)", "{:,.0f}", "lower"),
    ("wall_s", "total wall time (s)", "{:.0f}", "lower"),
]


def spread(values: list[float | None], fmt: str) -> str:
    got = sorted(v for v in values if v is not None)
    if not got:
        return "not reached"
    cell = " / ".join([fmt.format(got[0]), "**" + fmt.format(statistics.median(got)) + "**", fmt.format(got[-1])])
    missing = len(values) - len(got)
    return cell + (f" ({missing} of {len(values)} not reached)" if missing else "")


def pairs(runs: list[Run]) -> list[tuple[Run, Run]]:
    ours = [r for r in runs if r.system == "ours"]
    trl = [r for r in runs if r.system == "trl"]
    return list(zip(sorted(ours, key=lambda r: r.rep), sorted(trl, key=lambda r: r.rep), strict=False))


def pair_ratios(runs: list[Run], key: str) -> list[float]:
    out = []
    for a, b in pairs(runs):
        x, y = getattr(a, key), getattr(b, key)
        if x is not None and y:
            out.append(x / y)
    return out


def render(runs: list[Run], meta: dict) -> tuple[str, dict]:
    rows = []
    verdict = {}
    for key, label, fmt, better in METRICS:
        ratios = pair_ratios(runs, key)
        ratio = spread(ratios, "{:.2f}×") if ratios else "—"
        if ratios:
            verdict[key] = statistics.median(ratios)
        rows.append(
            f"| {label} | {spread([getattr(r, key) for r in runs if r.system == 'ours'], fmt)} | "
            f"{spread([getattr(r, key) for r in runs if r.system == 'trl'], fmt)} | {ratio} | {better} is better |"
        )
    ours_reached = all(r.to_target_s is not None for r in runs if r.system == "ours")
    speed = verdict.get("samples_per_s")
    reach = verdict.get("to_target_s")
    speed_ok = speed is not None and speed >= 2.0
    reach_ok = ours_reached and reach is not None and reach <= 1.0
    holds = "holds" if speed_ok and reach_ok else "does NOT hold"
    bar = (
        f"**The issue's bar {holds}.** Trained samples/s ours/TRL (median of per-pair ratios): "
        f"{'—' if speed is None else f'{speed:.2f}×'} (bar ≥ 2×: {'met' if speed_ok else 'not met'}); "
        f"time to reward 0.5 ours/TRL: {'—' if reach is None else f'{reach:.2f}×'} "
        f"(bar ≤ 1×: {'met' if reach_ok else 'not met'}). Both as each ships (threads, start-up, evals)."
    )
    # Each pair on its own as well: a median can hide a pair where the bar fails.
    each, met = [], 0
    for a, b in pairs(runs):
        x = a.samples_per_s / b.samples_per_s if a.samples_per_s and b.samples_per_s else None
        y = a.to_target_s / b.to_target_s if a.to_target_s and b.to_target_s else None
        met += x is not None and y is not None and x >= 2.0 and y <= 1.0
        each.append(f"#{a.rep} {'—' if x is None else f'{x:.2f}×'} / {'—' if y is None else f'{y:.2f}×'}")
    bar += f" Per pair (samples/s / time to 0.5): {'; '.join(each)}: the bar holds in {met} of {len(each)} pairs."
    per_run = [
        "| run | ok | steps | samples/s | s/step | → reward 0.5 (s) | first step (s) | peak RSS (MB) | wall (s) | "
        "reward first/last 5 | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    f = lambda v, fmt: "—" if v is None else fmt.format(v)  # noqa: E731
    for r in runs:
        per_run.append(
            f"| {r.system} #{r.rep} | {'yes' if r.ok else 'NO'} | {r.steps} | {f(r.samples_per_s, '{:.1f}')} | "
            f"{f(r.s_per_step, '{:.2f}')} | {f(r.to_target_s, '{:.0f}')} | {f(r.first_step_s, '{:.0f}')} | "
            f"{r.peak_rss_mb:,.0f} | {r.wall_s:.0f} | {f(r.reward_first5, '{:.2f}')} → {f(r.reward_last5, '{:.2f}')} | "
            f"{'; '.join(r.notes)} |"
        )
    v = meta["versions"]
    text = "\n".join(
        [
            f"{MARKER} vs TRL's GRPOTrainer",
            "",
            f"Written by `python -m bench.peer_trl` on {meta['finished']} UTC; {meta['reps']} interleaved repetitions each "
            f"(order {meta['order']}) in {meta['minutes']:.1f} min. Host: {os.cpu_count()} CPU cores, no GPU; "
            f"load average {meta['load_start']:.1f} at the start, {meta['load_end']:.1f} at the end, highest seen "
            f"during a run {meta['load_max']:.1f}. {meta['load_note']}",
            "",
            "Task, same on both: the tiny model `make train` builds (Qwen2-style, "
            f"{meta['shape']}; TRL trains a copy of the folder our run just built), the 288 questions of "
            "`data/lookup/train.jsonl` as one user turn through the model's chat template, "
            f"{TASK['prompts_per_step']} prompts × {TASK['samples_per_prompt']} samples per optimizer step, "
            f"≤ {TASK['max_new_tokens']} new tokens, temperature {TASK['temperature']:g}, {meta['steps']} steps, reward 1 "
            'when the completion contains "the". Optimisation: AdamW lr 3e-3 (2 warm-up steps, then constant), '
            "grad clip 1, PPO clip 0.2 / 0.28, no KL, token-mean loss, advantages normalised within each group, "
            "one gradient step per batch, fp32.",
            "",
            "- **Ours**: `python -m launcher train --recipe <copy of configs/single-turn.toml> --new` with "
            '`[rollout] reward = "peer_rewards:contains_the"`, `max_tokens_per_turn = 32`, `max_steps = '
            f"{meta['steps']}`; everything else as shipped: the tiny model built per run, Redis, our CPU inference "
            "server, rollout and trainer as local processes, the step-0 eval before training (full fine-tuning) "
            "and the final eval after it (16 held-out prompts each), one torch thread per service (the stack's "
            "default on 2 cores). Generation overlaps training: a step may train on samples from the policy one "
            "version behind (`max_staleness = 1`).",
            "- **TRL**: `GRPOTrainer` in its own venv, `GRPOConfig(per_device_train_batch_size=32, "
            "num_generations=4, max_completion_length=32, temperature=1.0, learning_rate=3e-3, warmup_steps=2, "
            "lr_scheduler_type='constant_with_warmup', max_grad_norm=1.0, beta=0.0, epsilon=0.2, epsilon_high=0.28, "
            "loss_type='dapo', scale_rewards='group', bf16=False, gradient_checkpointing=False, use_cpu=True)`, "
            "generation with `model.generate` in the same process (no vLLM on CPU), strictly on-policy; torch's "
            f"default threads ({meta['trl_threads']} here). `bf16` and `gradient_checkpointing` are switched off "
            "from TRL's defaults to match our fp32 full fine-tuning (bf16 matmuls on this CPU and recomputing a "
            "2-layer model's activations would only slow TRL down). One difference TRL's options cannot remove: "
            "Hugging Face's warm-up starts at lr 0, so TRL's first update is a no-op and its warm-up ends one step "
            "after ours (ours: 1.5e-3, then 3e-3).",
            f"- Versions: TRL {v.get('trl', '?')}, torch {v.get('torch', '?')} (both sides), transformers "
            f"{v.get('transformers', '?')} (TRL's venv; ours {meta['our_transformers']}), Python {sys.version.split()[0]}.",
            "- Measured from the command's start (process launch): samples/s and s/step over steps 2..N "
            "(per-step wall-clock stamps: our trainer's `train.jsonl`, a TRL callback's `on_log`); the reward "
            f"target is the first step whose trailing {WINDOW}-step mean reward is ≥ {TARGET}; peak RSS sums every "
            "process of the command's tree, sampled every 0.5 s. Cells: min / **median** / max; ratios are "
            "ours ÷ TRL per pair (runs next to each other in the order), median over pairs.",
            "",
            "| metric | ours | TRL | ours / TRL | |",
            "|---|---|---|---|---|",
            *rows,
            "",
            bar,
            "",
            "Per run:",
            "",
            *per_run,
            "",
        ]
    )
    return text, verdict


def write_peers(path: Path, section: str, marker: str = MARKER) -> None:
    """Replace (or add) the section starting with ``marker`` in peers.md, leaving the others as they are."""
    text = path.read_text() if path.exists() else "# Peer comparisons\n"
    if marker in text:
        head, _, rest = text.partition(marker)
        nxt = rest.find("\n## ")
        text = head + section + (rest[nxt + 1 :] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n")


# ---------------------------------------------------------------- main
