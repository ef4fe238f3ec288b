"""GRPO end to end against TRL's ``GRPOTrainer``: writes the GRPO section of ``bench/results/peers.md``.

One task on both systems, measured from the moment each command starts:

- the tiny model ``make train`` builds (our run builds it into its run folder; TRL trains a copy of that same
  folder, so both start from identical weights and tokenizer);
- the 288 questions of ``data/lookup/train.jsonl``, each one user turn through the tokenizer's chat template
  (plain text if it has none);
- 8 prompts × 4 samples per optimizer step, at most 32 new tokens, temperature 1, lr 3e-3 (2 warm-up steps,
  then constant), PPO clip 0.2 / 0.28, gradient clip 1, no KL, token-mean loss, group-normalised advantages;
- reward 1 when the completion contains "the", else 0 (the tiny model starts near 0.1).

Ours is ``python -m launcher train`` on a temporary copy of ``configs/single-turn.toml`` (reward, token
budget and step count set as above; everything else as shipped, the step-0 and final evals included). TRL is a
short ``GRPOTrainer`` script written to a temporary file and run in its own virtual environment (created
here on first use with ``pip install torch==<ours> trl``, reused afterwards; TRL's code never enters this
repository). Neither side gets thread settings from the bench: each runs as it ships on this machine.

The two alternate (ours, TRL, TRL, ours, ...) so slow drift in the machine's load hits both alike. Per run:
steady-state trained samples/s and s/step (steps 2..N: the first step carries one-off costs), time from the
command's start to the first step whose trailing 5-step mean reward is ≥ 0.5, time to the first step, peak RSS
of the whole process tree (sampled every 0.5 s) and total wall time.

    .venv/bin/python -m bench.peer_trl                # 3 repetitions each, writes peers.md
    .venv/bin/python -m bench.peer_trl --quick        # 1 repetition, 20 steps, prints only
    .venv/bin/python -m bench.peer_trl --rescore runs/peers/STAMP   # re-render a finished bench, no runs
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from bench._peer_trl_parts import (
    MARKER,
    TASK,
    WINDOW,
    Run,
    clean_env,
    json_lines,
    launch,
    render,
    run_stack,
    score,
    spread,
    trainer_records,
    write_peers,
)

__all__ = ["MARKER", "TASK", "Run", "score", "spread", "write_peers"]  # the unit tests read the parts here

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "single-turn.toml"
PROMPTS = ROOT / "data" / "lookup" / "train.jsonl"
WORK = ROOT / "runs" / "peers"  # ignored by git: the TRL venv, our run folders, raw per-run records
PEERS = ROOT / "bench" / "results" / "peers.md"
TORCH_PIN = "torch==2.13.0"  # resolves to the local CPU wheel; an open range pulls the CUDA build (GBs)


# The task, once, for both sides.
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


# ---------------------------------------------------------------- measuring


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
    start, end, code, load, folder = run_stack(run, recipe, tmp, out / "ours", out / f"ours-{rep}.log", 1500)
    log = Path(run.log)
    records = trainer_records(folder)
    run.notes += [f"step {r['step']}: {r['dropped_stale']} stale groups dropped" for r in records if r["dropped_stale"]]
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
    info = json_lines(log)
    run.notes.append(f"max load {load:.1f}")
    if not run.ok:
        run.notes.append(f"exit {code}: {log.read_text()[-300:]!r}")
    return run, info


# ---------------------------------------------------------------- report


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
