"""GRPO end to end against TRL's ``GRPOTrainer``: writes the GRPO section of ``bench/results/peers.md``.

One task on both systems, measured from the moment each command starts:

- the tiny model ``make train`` builds (our run builds it into its run folder; TRL trains a copy of that same
  folder, so both start from identical weights and tokenizer);
- the 288 questions of ``data/lookup/train.jsonl``, each one user turn through the tokenizer's chat template
  (plain text if it has none);
- 8 prompts × 4 samples per optimizer step, at most 32 new tokens, temperature 1, lr 3e-3 (2 warm-up steps,
  then constant), PPO clip 0.2 / 0.28, gradient clip 1, no KL, token-mean loss, group-normalised advantages;
- reward 1 when the completion contains "the", else 0 (the tiny model starts near 0.1).

Ours is ``python -m services.stack train`` on a temporary copy of ``configs/single-turn.toml`` (reward, token
budget and step count set as above; everything else as shipped, the step-0 and final evals included). TRL is a
short ``GRPOTrainer`` script written to a temporary file and run in its own virtual environment (created
here on first use with ``pip install torch==<ours> trl``, reused afterwards; TRL's code never enters this
repository). Neither side gets thread settings from the bench: each runs as it ships on this machine.

The two alternate (ours, TRL, TRL, ours, ...) so slow drift in the machine's load hits both alike. Per run:
steady-state trained samples/s and s/step (steps 2..N: the first step carries one-off costs), time from the
command's start to the first step whose trailing 5-step mean reward is ≥ 0.5, time to the first step, peak RSS
of the whole process tree (sampled every 0.5 s) and total wall time.

    .venv/bin/python bench/peer_trl.py                # 3 repetitions each, writes peers.md
    .venv/bin/python bench/peer_trl.py --quick        # 1 repetition, 20 steps, prints only
    .venv/bin/python bench/peer_trl.py --rescore runs/peers/STAMP   # re-render a finished bench, no runs
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "single-turn.toml"
PROMPTS = ROOT / "data" / "lookup" / "train.jsonl"
WORK = ROOT / "runs" / "peers"  # ignored by git: the TRL venv, our run folders, raw per-run records
PEERS = ROOT / "bench" / "results" / "peers.md"
TORCH_PIN = "torch==2.13.0"  # resolves to the local CPU wheel; an open range pulls the CUDA build (GBs)
MARKER = "## GRPO end to end"

# The task, once, for both sides.
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

REWARD_MODULE = """
def contains_the(completion, gold, row):
    return float("the" in completion)
"""

# Runs inside the TRL venv. Settings mirror ours where TRL has the knob; the callback writes one JSON line
# per optimizer step with the wall-clock time, so both sides are timed the same way.
TRL_SCRIPT = r"""
import json, sys, time
cfg = json.loads(open(sys.argv[1]).read())
import torch
from datasets import Dataset
from transformers import AutoTokenizer, TrainerCallback
import transformers, trl
from trl import GRPOConfig, GRPOTrainer

print(json.dumps({"versions": {"trl": trl.__version__, "torch": torch.__version__,
      "transformers": transformers.__version__}, "torch_threads": torch.get_num_threads()}), flush=True)
tok = AutoTokenizer.from_pretrained(cfg["model"])
chat = bool(getattr(tok, "chat_template", None))
rows = [json.loads(l) for l in open(cfg["prompts"]) if l.strip()]
data = Dataset.from_list([{"prompt": [{"role": "user", "content": r["question"]}] if chat else r["question"]}
                          for r in rows])

def contains_the(completions, **kwargs):
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float("the" in t) for t in texts]

class StepLog(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            with open(cfg["steps"], "a") as fh:
                fh.write(json.dumps({"step": state.global_step, "time": time.time(), "reward": logs["reward"],
                                     "samples": cfg["batch"]}) + "\n")

args = GRPOConfig(
    output_dir=cfg["out"], max_steps=cfg["steps_n"], per_device_train_batch_size=cfg["batch"],
    gradient_accumulation_steps=1, num_generations=cfg["samples_per_prompt"],
    max_completion_length=cfg["max_new_tokens"], temperature=cfg["temperature"],
    learning_rate=cfg["lr"], warmup_steps=cfg["warmup_steps"], lr_scheduler_type="constant_with_warmup",
    weight_decay=0.0, max_grad_norm=cfg["grad_clip"], beta=0.0, epsilon=cfg["clip_low"],
    epsilon_high=cfg["clip_high"], loss_type="dapo", scale_rewards="group", num_iterations=1,
    bf16=False, gradient_checkpointing=False, use_cpu=True, seed=cfg["seed"],
    logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
)
print(json.dumps({"chat_template": chat, "generation_batch_size": args.generation_batch_size}), flush=True)
trainer = GRPOTrainer(model=cfg["model"], reward_funcs=contains_the, args=args, train_dataset=data,
                      processing_class=tok, callbacks=[StepLog()])
trainer.train()
"""


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
    reward_first5: float | None = None
    reward_last5: float | None = None
    steps: int = 0
    log: str = ""
    notes: list[str] = field(default_factory=list)
    start: float = 0.0  # wall clock at launch; with ``records`` (per step: step, time, reward, samples) it
    records: list[dict] = field(default_factory=list)  # lets --rescore recompute every metric later


# ---------------------------------------------------------------- measuring


class TreeSampler(threading.Thread):
    """Peak summed RSS of a process and all its descendants, and the highest 1-min load average seen."""

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.every_s = pid, every_s
        self.peak = 0
        self.load_max = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self.done.is_set():
            total = 0
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for p in procs:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):  # exited since listed
                    total += p.memory_info().rss
            self.peak = max(self.peak, total)
            self.load_max = max(self.load_max, os.getloadavg()[0])
            self.done.wait(self.every_s)


def launch(
    cmd: list[str], env: dict[str, str], log: Path, cwd: Path, timeout_s: float
) -> tuple[float, int, float, float]:
    """Run ``cmd`` to the end; returns (start time, exit code, peak tree RSS in MB, highest load seen)."""
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
    return start, code, sampler.peak / 2**20, sampler.load_max


def score(run: Run, start: float, end: float, steps: list[dict]) -> None:
    """Fill the timing and reward metrics from per-step records (``step``, ``time``, ``reward``, ``samples``)."""
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
        if statistics.fmean(rewards[i - WINDOW + 1 : i + 1]) >= TARGET:
            run.to_target_s = steps[i]["time"] - start
            break


def clean_env() -> dict[str, str]:
    """The caller's environment without anything that would tune either side: thread counts and our own
    CODA_* overrides are left to each system's defaults."""
    drop = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TORCH_NUM_THREADS", "PYTHONPATH")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("CODA_")}


# ---------------------------------------------------------------- the two systems


def ours_recipe(tmp: Path, steps: int) -> Path:
    text = RECIPE.read_text()
    subs = [
        (r'^# reward = "my_rewards:contains_word"$', 'reward = "peer_rewards:contains_the"'),
        (r"^max_tokens_per_turn = \d+", f"max_tokens_per_turn = {TASK['max_new_tokens']}"),
        (r"^max_steps = \d+", f"max_steps = {steps}"),
    ]
    for pattern, new in subs:
        text, n = re.subn(pattern, new, text, flags=re.M)
        if n != 1:  # the shipped recipe changed shape: better to stop than to bench another task
            raise SystemExit(f"{RECIPE}: expected one line matching {pattern!r}, found {n}")
    # The knobs the task fixes must be what the recipe ships, or the comparison is of another task.
    for key, value in (
        ("groups_per_step", 8),
        ("n_samples", 4),
        ("temperature", 1.0),
        ("lr", 3e-3),
        ("warmup_steps", 2),
    ):
        m = re.search(rf"^{key} = (\S+)", text, flags=re.M)
        if not m or float(m.group(1)) != float(value):
            raise SystemExit(f"{RECIPE}: {key} is {m and m.group(1)}, the bench assumes {value}")
    path = tmp / "single-turn-contains-the.toml"
    path.write_text(text)
    (tmp / "peer_rewards.py").write_text(REWARD_MODULE)
    return path


def run_ours(rep: int, steps: int, tmp: Path, out: Path) -> tuple[Run, Path | None]:
    run = Run("ours", rep)
    recipe = ours_recipe(tmp, steps)
    run_root = out / "ours"
    before = set(run_root.glob("*")) if run_root.exists() else set()
    env = {**clean_env(), "PYTHONPATH": os.pathsep.join([str(tmp), str(ROOT)])}
    cmd = [
        sys.executable,
        "-m",
        "services.stack",
        "train",
        "--recipe",
        str(recipe),
        "--new",
        "--run-root",
        str(run_root),
    ]
    log = out / f"ours-{rep}.log"
    start, code, rss, load = launch(cmd, env, log, ROOT, timeout_s=1500)
    end = time.time()
    run.log, run.peak_rss_mb, run.ok = str(log), rss, code == 0
    folders = sorted(set(run_root.glob("*")) - before)
    folder = folders[-1] if folders else None
    records = []
    if folder and (folder / "trainer" / "train.jsonl").is_file():
        for line in (folder / "trainer" / "train.jsonl").read_text().splitlines():
            r = json.loads(line)
            records.append(
                {"step": r["step"], "time": r["time"], "reward": r["reward_mean"], "samples": r.get("rl_sequences", 32)}
            )
            if r.get("dropped_stale"):
                run.notes.append(f"step {r['step']}: {r['dropped_stale']} stale groups dropped")
    score(run, start, end, records)
    run.notes += phases(log.read_text(), start, records)
    run.notes.append(f"max load {load:.1f}")
    if not run.ok:
        run.notes.append(f"exit {code}")
    return run, (folder / "model") if folder else None


def phases(text: str, start: float, records: list[dict]) -> list[str]:
    """Where our start-up goes, from the stack's own progress lines (``[make train HH:MM:SS] ...``, local
    time to the second): building the model, starting the servers, the step-0 eval, then starting the trainer
    and rollout up to the end of step 1."""
    began = dt.datetime.fromtimestamp(start)

    def clock(line_start: str) -> float | None:
        m = re.search(r"\[make train (\d\d):(\d\d):(\d\d)\] " + re.escape(line_start), text)
        if not m:
            return None
        at = began.replace(hour=int(m[1]), minute=int(m[2]), second=int(m[3]), microsecond=0)
        if at < began - dt.timedelta(minutes=1):  # the run crossed midnight
            at += dt.timedelta(days=1)
        return at.timestamp()

    notes = [
        m.group(0)
        for p in (r"make-tiny done in \d+s", r"eval-step0 done in \d+s", r"eval-final done in \d+s")
        if (m := re.search(p, text))
    ]
    tiny, servers, evaluated = clock("make-tiny done"), clock("servers healthy"), clock("step-0 eval:")
    if tiny and servers:
        notes.insert(1, f"servers healthy {servers - tiny:.0f}s later")
    if evaluated and records:
        notes.append(f"trainer + rollout start → step 1 done {min(r['time'] for r in records) - evaluated:.0f}s")
    return notes


def trl_venv(path: Path, torch_version: str) -> Path:
    """TRL's own environment, built once: ``python -m venv`` then pip with the torch pin and trl."""
    py = path / "bin" / "python"
    if py.exists() and subprocess.run([py, "-c", "import trl, torch"], capture_output=True).returncode == 0:
        return py
    print(f"building TRL's venv in {path} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
    subprocess.run([py, "-m", "pip", "install", "-q", f"torch=={torch_version}", "trl"], check=True)
    return py


def run_trl(rep: int, steps: int, py: Path, model: Path, tmp: Path, out: Path) -> tuple[Run, dict]:
    run = Run("trl", rep)
    work = tmp / f"trl-{rep}"
    work.mkdir()
    # TRL trains a copy, so nothing it writes can touch our run folder's model.
    local_model = work / "model"
    shutil.copytree(model, local_model)
    step_log = out / f"trl-{rep}-steps.jsonl"
    step_log.unlink(missing_ok=True)
    cfg = {
        **TASK,
        "model": str(local_model),
        "prompts": str(PROMPTS),
        "steps": str(step_log),
        "out": str(work / "out"),
        "steps_n": steps,
        "batch": TASK["prompts_per_step"] * TASK["samples_per_prompt"],
    }
    (work / "cfg.json").write_text(json.dumps(cfg))
    script = work / "grpo_trl.py"
    script.write_text(TRL_SCRIPT)
    log = out / f"trl-{rep}.log"
    start, code, rss, load = launch([str(py), str(script), str(work / "cfg.json")], clean_env(), log, work, 1500)
    end = time.time()
    run.log, run.peak_rss_mb, run.ok = str(log), rss, code == 0
    records = [json.loads(line) for line in step_log.read_text().splitlines()] if step_log.exists() else []
    score(run, start, end, records)
    info: dict = {}
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                info.update(json.loads(line))
    run.notes.append(f"max load {load:.1f}")
    if not run.ok:
        run.notes.append(f"exit {code}: {log.read_text()[-300:]!r}")
    return run, info


# ---------------------------------------------------------------- report

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
            f"Written by `bench/peer_trl.py` on {meta['finished']} UTC; {meta['reps']} interleaved repetitions each "
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
            "- **Ours**: `python -m services.stack train --recipe <copy of configs/single-turn.toml> --new` with "
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


def write_peers(path: Path, section: str) -> None:
    """Replace (or add) this section of peers.md, leaving the other sections as they are."""
    text = path.read_text() if path.exists() else "# Peer comparisons\n"
    if MARKER in text:
        head, _, rest = text.partition(MARKER)
        nxt = rest.find("\n## ")
        text = head + section + (rest[nxt + 1 :] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n")


# ---------------------------------------------------------------- main


def interleaved(reps: int) -> list[str]:
    """ours, trl, trl, ours, ours, trl, ...: each system goes first in half of the pairs."""
    order = []
    for i in range(reps):
        order += ["ours", "trl"] if i % 2 == 0 else ["trl", "ours"]
    return order


def rescore(folder: Path, peers: Path, write: bool) -> None:
    """Score a finished bench again from what it saved (runs.json, meta.json) and re-render the section:
    the report can change without spending another half hour of machine time."""
    meta = json.loads((folder / "meta.json").read_text())
    runs = []
    for saved in json.loads((folder / "runs.json").read_text()):
        run = Run(**saved)
        score(run, run.start, run.start + run.wall_s, run.records)
        runs.append(run)
    section, _ = render(runs, meta)
    print(section)
    if not meta.get("quick") or write:
        write_peers(peers, section)
        print(f"wrote {peers}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each system (default 3)")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per run (default 30)")
    ap.add_argument("--quick", action="store_true", help="1 repetition of 20 steps; prints, does not write peers.md")
    ap.add_argument("--trl-venv", type=Path, default=WORK / "trl-venv", help="TRL's venv (built when missing)")
    ap.add_argument("--peers", type=Path, default=PEERS, help="the peers.md to update")
    ap.add_argument("--load-note", default="", help="a sentence on the machine's load, for the report")
    ap.add_argument("--write", action="store_true", help="write peers.md even with --quick")
    ap.add_argument("--rescore", type=Path, help="recompute and re-render a finished bench's folder (runs/peers/…)")
    args = ap.parse_args()
    if args.rescore:
        rescore(args.rescore, args.peers, args.write)
        return
    if args.quick:
        args.reps, args.steps = 1, 20
    if args.steps < WINDOW + 1:
        ap.error(f"--steps must be at least {WINDOW + 1}")

    import torch
    import transformers

    py = trl_venv(args.trl_venv, torch.__version__.split("+")[0])
    out = WORK / dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    order = interleaved(args.reps)
    print(f"order: {' '.join(order)}; logs in {out}", flush=True)
    load_start, started = os.getloadavg()[0], time.time()
    runs: list[Run] = []
    model: Path | None = None
    info: dict = {}
    counts = {"ours": 0, "trl": 0}
    with tempfile.TemporaryDirectory(prefix="peer-trl-") as tmp_name:
        tmp = Path(tmp_name)
        for system in order:
            counts[system] += 1
            rep = counts[system]
            if system == "ours":
                run, built = run_ours(rep, args.steps, tmp, out)
                model = built if built and (built / "config.json").exists() else model
            else:
                if model is None:
                    raise SystemExit("our run built no model for TRL to start from; see " + str(out))
                run, got = run_trl(rep, args.steps, py, model, tmp, out)
                info.update(got)
            runs.append(run)
            print(json.dumps({k: v for k, v in asdict(run).items() if k != "records"}), flush=True)
    (out / "runs.json").write_text(json.dumps([asdict(r) for r in runs], indent=1))
    conf = json.loads((model / "config.json").read_text()) if model else {}
    shape = (
        f"{conf.get('num_hidden_layers', '?')} layers × {conf.get('hidden_size', '?')}, "
        f"{conf.get('vocab_size', '?')}-token BPE vocabulary"
    )
    loads = [float(m.group(1)) for r in runs for n in r.notes if (m := re.match(r"max load ([\d.]+)", n))]
    meta = {
        "finished": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"),
        "reps": args.reps,
        "order": ", ".join(order),
        "minutes": (time.time() - started) / 60,
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "load_max": max(loads, default=0.0),
        "load_note": args.load_note,
        "steps": args.steps,
        "versions": info.get("versions", {}),
        "trl_threads": info.get("torch_threads", "?"),
        "our_transformers": transformers.__version__,
        "shape": shape,
    }
    (out / "meta.json").write_text(json.dumps({**meta, "quick": args.quick}, indent=1))
    section, _ = render(runs, meta)
    print("\n" + section)
    if not args.quick or args.write:
        write_peers(args.peers, section)
        print(f"wrote {args.peers}")


if __name__ == "__main__":
    main()
