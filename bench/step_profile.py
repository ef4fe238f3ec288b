"""One RL trainer step of the real model, piece by piece: writes ``bench/results/step_profile.md``.

The issue-26 case: SmolLM2-135M-Instruct with LoRA r16 on every projection, 8 prompts × 4 samples, prompts of
35–55 tokens, 32 new tokens each (random token ids: the cost of a step does not depend on which tokens). Each
configuration runs in a fresh process (peak RSS is per process), ``--steps`` steps, the first one dropped (it
carries one-off costs); configurations alternate over ``--reps`` rounds so the machine's drift hits all alike.

- ``before``: the layout as it was (one copy of the prompt per sample, 4096-token micro-batches, 1 thread);
- ``shared``: samples of one prompt share a single copy of it, 1024-token micro-batches, 1 thread;
- ``shared, 2 threads``: the same with every core (what an on-policy run gets: trainer and server take turns);
- ``shared, 2 threads, 512`` / ``384`` / ``256``: smaller micro-batches (the activations, ~1.3 MB a token, set the peak).

It also measures what bf16 autocast costs and changes here: the time of one no-grad scoring pass and the
logprob mismatch against fp32 on sampled text (mean/max |Δ log p|, k3 KL).

    .venv/bin/python -m bench.step_profile                 # 2 rounds, 4 steps each
    .venv/bin/python -m bench.step_profile --reps 1 --steps 3
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import _step_profile_2wiki as multi

ROOT = Path(__file__).resolve().parents[1]

MODEL = ROOT / "runs" / "models" / "smollm2-135m-instruct"
OUT = ROOT / "bench" / "results" / "step_profile.md"
CONFIGS = {
    "before": {"threads": 1, "budget": 4096, "share": False},
    "shared": {"threads": 1, "budget": 1024, "share": True},
    "shared, 2 threads": {"threads": 2, "budget": 1024, "share": True},
    "shared, 2 threads, 512": {"threads": 2, "budget": 512, "share": True},
    "shared, 2 threads, 256": {"threads": 2, "budget": 256, "share": True},
    "shared, 2 threads, 384": {"threads": 2, "budget": 384, "share": True},
}


def batch(seed: int = 0):
    import random

    from services.trainer.packing import TrainSeq

    rng = random.Random(seed)
    seqs = []
    for i in range(32):
        if i % 4 == 0:
            prompt = [rng.randrange(49152) for _ in range(rng.randint(35, 55))]
        toks = prompt + [rng.randrange(49152) for _ in range(32)]
        n = len(toks)
        fields = {"old_logp": [-5.0] * n, "adv": [rng.uniform(-1, 1)] * n, "staleness": [0.0] * n}
        seqs.append(TrainSeq(toks, [0] * len(prompt) + [1] * 32, fields, i))
    return seqs


def child(cfg: dict, steps: int) -> dict:
    """Runs in its own process: ``steps`` train steps of one configuration."""
    import resource

    import torch

    torch.set_num_threads(cfg["threads"])
    from services.trainer.config import TrainerSettings
    from services.trainer.engine import build_engine, init_distributed
    from services.trainer.step import Objective, StepInput, layout, train_step

    settings = TrainerSettings(
        model=str(MODEL),
        finetune="lora",
        lora={
            "rank": 16,
            "alpha": 32,
            "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        },
        micro_batch_tokens=cfg["budget"],
        precision="fp32",
    )
    eng = build_engine(settings, init_distributed())
    seqs = batch()
    objective = Objective(settings)
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        train_step(eng, StepInput(seqs), objective, None, settings.micro_batch_tokens, share_prompts=cfg["share"])
        seconds.append(time.perf_counter() - start)
    batches = layout(seqs, settings.micro_batch_tokens, True, cfg["share"])
    return {
        "seconds": seconds,
        "tokens": sum(b.num_tokens for b in batches),
        "micro_batches": len(batches),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def bf16_check() -> dict:
    """No-grad scoring of sampled text in fp32 and under bf16 autocast: seconds and the logprob mismatch."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from services.trainer.logprobs import PolicyLogprobs, batch_inputs
    from services.trainer.packing import TrainSeq, pack

    torch.manual_seed(0)
    torch.set_num_threads(2)
    lm = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(MODEL)
    questions = ["Who wrote Hamlet?", "What is the capital of France?", "Which river flows through Vienna?"]
    seqs = []
    for i, q in enumerate(questions):
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        prompt = tok(ids, add_special_tokens=False)["input_ids"]
        out = lm.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=True, temperature=1.0)[0].tolist()
        seqs.append(TrainSeq(out, [0] * len(prompt) + [1] * (len(out) - len(prompt)), {}, i))
    (b,) = pack(seqs, 4096)
    res = {}
    for name, ac in (("fp32", None), ("bf16", torch.bfloat16)):
        policy = PolicyLogprobs(lm, autocast=ac)
        with torch.no_grad():
            policy(**batch_inputs(b, torch.device("cpu")))  # warm-up
            start = time.perf_counter()
            logp, _ = policy(**batch_inputs(b, torch.device("cpu")))
            res[name] = (logp, time.perf_counter() - start)
    diff = (res["bf16"][0] - res["fp32"][0])[b.target_mask > 0]
    return {
        "tokens": int((b.target_mask > 0).sum()),
        "fp32_s": res["fp32"][1],
        "bf16_s": res["bf16"][1],
        "mean_abs": float(diff.abs().mean()),
        "max_abs": float(diff.abs().max()),
        "k3": float((diff.exp() - 1 - diff).mean()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=2, help="rounds over the configurations")
    ap.add_argument("--steps", type=int, default=4, help="steps per run (the first is dropped)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS), help="which to run")
    ap.add_argument("--no-write", action="store_true", help="print, leave step_profile.md alone")
    ap.add_argument(
        "--case",
        choices=["single-turn", "2wiki"],
        default="single-turn",
        help="single-turn: the synthetic 8×4 case above; 2wiki: an RL step of smol-2wiki on recorded groups, "
        "today's levers side by side (bench/_step_profile_2wiki.py)",
    )
    ap.add_argument("--arms", nargs="+", choices=list(multi.ARMS), default=list(multi.ARMS), help="2wiki: which arms")
    ap.add_argument("--baseline", default="03132ed", help="2wiki: the commit the `before` arm runs")
    ap.add_argument("--model", default=str(MODEL), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case == "2wiki":
        if args.child:
            multi.child_main(args.child, args.steps, args.model)
            return
        return run_multi_turn(args)
    if args.child:
        print(json.dumps(child(CONFIGS[args.child], args.steps)))
        return
    if not MODEL.exists():
        raise SystemExit(f"{MODEL} is missing: `make train` (or `python -m tools.import_gguf`) makes it")
    started = time.time()
    runs: dict[str, list[dict]] = {name: [] for name in args.configs}
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONWARNINGS": "ignore"}
    for rep in range(args.reps):
        for name in args.configs if rep % 2 == 0 else reversed(args.configs):
            out = (
                subprocess.run(
                    [sys.executable, "-m", "bench.step_profile", "--child", name, "--steps", str(args.steps)],
                    cwd=ROOT,
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            runs[name].append(json.loads(out))
            print(name, runs[name][-1], flush=True)
    if args.no_write or set(args.configs) != set(CONFIGS):
        return
    bf16 = bf16_check()
    write(runs, bf16, args, time.time() - started)


MULTI_BEGIN, MULTI_END = "<!-- multi-turn case: begin -->", "<!-- multi-turn case: end -->"


def host() -> str:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    from shared.precision import native_bf16

    return f"{os.cpu_count()} CPU cores ({cpu}; native bf16: {'yes' if native_bf16() else 'no'})"


def run_multi_turn(args: argparse.Namespace) -> None:
    """``--case 2wiki``: the arms side by side; its section of step_profile.md replaced (the rest kept)."""
    if not MODEL.exists():
        raise SystemExit(f"{MODEL} is missing: `make train RECIPE=smol-2wiki` makes it")
    started = time.time()
    runs = multi.run(ROOT, args.arms, args.reps, args.steps, args.baseline, Path(args.model))
    lines = multi.report(runs, args.reps, args.steps, args.baseline, host(), time.time() - started)
    print("\n".join(lines))
    if args.no_write:
        return
    (OUT.parent / "step_profile-2wiki.json").write_text(json.dumps(runs, indent=1) + "\n")
    text = OUT.read_text() if OUT.exists() else ""
    if MULTI_BEGIN in text:
        head, rest = text.split(MULTI_BEGIN, 1)
        text = head + rest.split(MULTI_END, 1)[1].lstrip("\n")
    OUT.write_text(text.rstrip("\n") + "\n\n" + "\n".join([MULTI_BEGIN, *lines, MULTI_END]) + "\n")


def write(runs: dict[str, list[dict]], bf16: dict, args: argparse.Namespace, wall: float) -> None:
    base = statistics.median(s for r in runs["before"] for s in r["seconds"][1:])
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    from shared.precision import native_bf16

    lines = [
        "# One RL trainer step of SmolLM2-135M-Instruct + LoRA, piece by piece",
        "",
        f"Written by `python -m bench.step_profile` on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC in {wall / 60:.1f} min; "
        f"host: {os.cpu_count()} CPU cores ({cpu}; native bf16: {'yes' if native_bf16() else 'no'}). "
        f"{args.reps} rounds, {args.steps} steps per run (first dropped), configurations alternating. "
        "Case: LoRA r16 on all 7 projections, 8 prompts × 4 samples, prompts 35–55 tokens, 32 new tokens, fp32.",
        "",
        "| layout | threads | micro-batch tokens | tokens through the model | micro-batches | s/step (median) "
        "| vs before | peak RSS (MB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, cfg in CONFIGS.items():
        secs = [s for r in runs[name] for s in r["seconds"][1:]]
        med = statistics.median(secs)
        r0 = runs[name][0]
        rss = max(r["peak_rss_mb"] for r in runs[name])
        lines.append(
            f"| {name} | {cfg['threads']} | {cfg['budget']} | {r0['tokens']:,} | {r0['micro_batches']} | "
            f"{med:.1f} ({min(secs):.1f}–{max(secs):.1f}) | {base / med:.2f}× | {rss:,.0f} |"
        )
    lines += [
        "",
        f"bf16 autocast here: a no-grad scoring pass of {bf16['tokens']} sampled tokens took "
        f"{bf16['bf16_s']:.2f} s against {bf16['fp32_s']:.2f} s in fp32 ({bf16['bf16_s'] / bf16['fp32_s']:.1f}×); "
        f"logprob mismatch bf16 vs fp32: mean |Δ log p| {bf16['mean_abs']:.4f}, max {bf16['max_abs']:.3f}, "
        f'k3 KL {bf16["k3"]:.2e}. `precision = "auto"` picks bf16 only on a CPU with AVX512-BF16 or AMX.',
        "",
    ]
    OUT.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
