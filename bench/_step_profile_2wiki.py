"""The multi-turn case of ``python -m bench.step_profile`` (``--case 2wiki``): one RL step of ``smol-2wiki`` on recorded data.

The step input is real: ``bench/data/smol-2wiki-step.json.xz`` holds 28 trajectory groups a smol-2wiki flat GRPO run
published (bench.qa, 2Wiki seed 0, policy versions 10-22) and 40 of its demonstrations. A step takes the
recipe's 2 groups and 4 demonstrations; advantages are GRPO's (the trainer's ``role_advantages``), samples with
advantage 0 are left out as ``zero_advantage = "skip"`` does. Steps are the first ``steps`` group pairs with a
nonzero advantage, the same for every arm.

``[trainer.lora] layers`` exists in this tree only, so that lever is measured on top of the prefix tree (against the
``prefix tree`` arm); the others against ``before``. Each arm runs in a fresh process (peak RSS is per process) against the tree it names: ``before`` against a git
worktree of ``--baseline`` (the commit before this round's changes), every other arm against this tree; arms
alternate over ``--reps`` rounds so the machine's drift hits all alike. Seconds are split by phase from timers
around the engine's forward, backward and optimizer step (backward includes the recompute of checkpointed
layers); the largest bf16 matmul rate measured in the same process is the CPU's limit the phases are held against.
"""

from __future__ import annotations

import json
import lzma
import os
import resource
import statistics
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "smol-2wiki-step.json.xz"
RECIPE = "configs/smol-2wiki.toml"
# Arm -> (tree: "baseline" or "head", trainer overrides of the recipe). Each lever on its own, then together.
ARMS: dict[str, tuple[str, dict]] = {
    "before": ("baseline", {}),
    "prefix tree": ("head", {}),
    "prefix tree + lora top 10 layers": ("head", {"lora": {"layers": 10}}),
    "sft_batch 2": ("baseline", {"sft_batch": 2}),
    "no checkpointing": ("baseline", {"gradient_checkpointing": False}),
    "tree + top 10 + sft 2": ("head", {"lora": {"layers": 10}, "sft_batch": 2}),
}


def load_data() -> dict:
    with lzma.open(DATA, "rt") as f:
        return json.load(f)


def step_inputs(data: dict, steps: int, sft_batch: int) -> list[tuple[list, list]]:
    """``steps`` of (RL sequences, demonstrations) as the trainer builds them from the recorded groups."""
    from services.trainer.batches import teaching
    from services.trainer.packing import TrainSeq
    from services.trainer.rl.advantages import role_advantages

    groups, demos = data["groups"], data["demonstrations"]
    out = []
    for pair in range(0, len(groups) - 1, 2):
        two = groups[pair : pair + 2]
        rows = [(g["group_id"], s) for g in two for s in g["samples"]]
        adv = role_advantages(
            [s["reward"] for _, s in rows],
            [g for g, _ in rows],
            ["policy"] * len(rows),
            [f"{g}/{s['sample_id']}" for g, s in rows],
            [None] * len(rows),
            "inherit",
            "grpo",
            "unbiased",
            1e-6,
        ).advantages
        seqs = [
            TrainSeq(
                s["token_ids"],
                s["loss_mask"],
                {
                    "old_logp": s["logprobs"],
                    "adv": [float(a)] * len(s["token_ids"]),
                    "staleness": [1.0] * len(s["token_ids"]),
                },
                i,
            )
            for i, ((_, s), a) in enumerate(zip(rows, adv, strict=True))
        ]
        kept, _ = teaching(seqs)
        if not kept:
            continue
        k = len(out) * sft_batch
        sft = [TrainSeq(d["token_ids"], d["loss_mask"], {}, i) for i, d in enumerate(demos[k : k + sft_batch])]
        out.append((kept, sft))
        if len(out) == steps:
            break
    return out


def token_kinds(rl: list, sft: list) -> dict[str, int]:
    """Tokens of a step by kind: prompt (before the first trained token), generated (trained), observations
    (untrained after the first trained token), demonstrations."""
    kinds = {"prompt": 0, "generated": 0, "observations": 0, "demonstrations": sum(len(s.tokens) for s in sft)}
    for s in rl:
        first = s.mask.index(1)
        kinds["prompt"] += first
        kinds["generated"] += sum(s.mask)
        kinds["observations"] += len(s.tokens) - first - sum(s.mask)
    return kinds


def matmul_gflops(threads: int, dtype: str = "bf16") -> float:
    """The rate of a large bf16 matmul (autocast, as the trainer's decoder runs; ``dtype="fp32"``: plain fp32)
    on this CPU: its limit."""
    import torch

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
        a @ b
        start = time.perf_counter()
        for _ in range(5):
            a @ b
    return 5 * 2 * 2048**3 / (time.perf_counter() - start) / 1e9


def child(arm: str, steps: int, model: str) -> dict:
    """Runs in its own process with the arm's tree first on ``sys.path``: ``steps`` train steps, timed by phase."""
    import torch

    torch.set_num_threads(2)
    from services.trainer.config import TrainerSettings
    from services.trainer.engine import build_engine, init_distributed
    from services.trainer.step import Objective, StepInput, layout, train_step

    _, overrides = ARMS[arm]
    settings = TrainerSettings.load(RECIPE, model=model, **overrides)
    eng = build_engine(settings, init_distributed())
    inputs = step_inputs(load_data(), steps, settings.sft_batch)
    phases = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    forward, backward, optimizer = eng.engine.forward, eng.engine.backward, eng.engine.step

    def timed(name, fn):
        def run(*a, **kw):
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                phases[name] += time.perf_counter() - start

        return run

    eng.engine.forward = timed("forward", forward)
    eng.engine.backward = timed("backward", backward)
    eng.engine.step = timed("optimizer", optimizer)
    objective = Objective(settings)
    rows = []
    for rl, sft in inputs:
        for k in phases:
            phases[k] = 0.0
        start = time.perf_counter()
        res = train_step(eng, StepInput(rl, sft, 1.0), objective, None, settings.micro_batch_tokens)
        total = time.perf_counter() - start
        rl_tokens = sum(b.num_tokens for b in layout(rl, settings.micro_batch_tokens, True, True))
        rows.append(
            {
                "seconds": total,
                **phases,
                "sft_micro_batches": res.sft_micro_batches,
                "rl_micro_batches": res.rl_micro_batches,
                "rl_tokens_through_model": rl_tokens,
                "rl_tokens_plain": sum(len(s.tokens) for s in rl),
                "rl_samples": len(rl),
                **token_kinds(rl, sft),
            }
        )
    start = time.perf_counter()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        eng.lm.save_pretrained(tmp, safe_serialization=True)
    publish = time.perf_counter() - start
    layers = eng.policy.base().config.num_hidden_layers
    decoder = sum(p.numel() for n, p in eng.policy.base().named_parameters() if ".layers." in n and "lora" not in n)
    return {
        "steps": rows,
        "publish_seconds": publish,
        "decoder_params": decoder,
        "layers": layers,
        "matmul_gflops": matmul_gflops(2),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "precision": str(eng.policy.autocast or "fp32"),
    }


def child_main(arm: str, steps: int, model: str) -> None:
    """The child's entry (``python -m bench.step_profile --case 2wiki --child ARM``, run by ``run`` with the arm's
    tree as cwd and first on PYTHONPATH): refuses to measure if ``services`` came from another tree."""
    import services

    tree = Path(os.environ["CODA_PROFILE_TREE"]).resolve()
    got = Path(services.__file__).resolve().parents[1]
    if got != tree:
        raise SystemExit(f"arm {arm!r}: services imported from {got}, not from its tree {tree}")
    os.chdir(tree)
    print(json.dumps(child(arm, steps, model)))


def summary(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per arm: medians over every measured step of every round (each run's first step dropped)."""
    out = {}
    for arm, rs in runs.items():
        steps = [s for r in rs for s in r["steps"][1:]]

        def med(key: str, steps: list[dict] = steps) -> float:
            return statistics.median(s[key] for s in steps)

        out[arm] = {
            "seconds": med("seconds"),
            "forward": med("forward"),
            "backward": med("backward"),
            "optimizer": med("optimizer"),
            "rl_through": sum(s["rl_tokens_through_model"] for s in steps),
            "rl_plain": sum(s["rl_tokens_plain"] for s in steps),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
            "publish": statistics.median(r["publish_seconds"] for r in rs),
            "gflops": statistics.median(r["matmul_gflops"] for r in rs),
            "n": len(steps),
            "min": min(s["seconds"] for s in steps),
            "max": max(s["seconds"] for s in steps),
        }
    return out


def baseline_tree(root: Path, ref: str) -> Path:
    """A worktree of ``ref`` beside the checkout (made once, reused)."""
    import subprocess

    sha = subprocess.run(["git", "rev-parse", ref], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    tree = Path("/tmp") / f"coda-profile-{sha[:12]}"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=root, check=True)
    return tree


def run(root: Path, arms: list[str], reps: int, steps: int, baseline: str, model: Path) -> dict[str, list]:
    """Every arm ``reps`` times, alternating (reversed on odd rounds); returns each run's child output.

    A child is ``python -m bench.step_profile`` with cwd and PYTHONPATH its arm's tree, then ``root``: the
    tree's ``services``/``shared``/``agents`` come first; ``bench`` comes from ``root`` while the tree's
    ``bench/`` is no regular package (an older commit's plain folder of scripts) and from the tree otherwise."""
    import subprocess

    trees = {"head": root, "baseline": baseline_tree(root, baseline)}
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    for rep in range(reps):
        for i, arm in enumerate(arms if rep % 2 == 0 else list(reversed(arms))):
            env = {
                **os.environ,
                "OMP_NUM_THREADS": "2",
                "PYTHONWARNINGS": "ignore",
                "CODA_PROFILE_TREE": str(trees[ARMS[arm][0]]),
                "MASTER_PORT": str(29700 + 10 * rep + i),
                "PYTHONPATH": os.pathsep.join([str(trees[ARMS[arm][0]]), str(root)]),
            }
            cmd = [
                sys.executable,
                "-m",
                "bench.step_profile",
                "--case",
                "2wiki",
                "--child",
                arm,
                "--steps",
                str(steps),
                "--model",
                str(model),
            ]
            proc = subprocess.run(cmd, cwd=trees[ARMS[arm][0]], env=env, capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"arm {arm!r} failed:\n{proc.stderr[-3000:]}")
            runs[arm].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            s = summary({arm: runs[arm][-1:]})[arm]
            print(f"round {rep + 1} {arm}: {s['seconds']:.1f} s/step, peak RSS {s['peak_rss_mb']:,.0f} MB", flush=True)
    return runs


def report(runs: dict[str, list[dict]], reps: int, steps: int, baseline: str, host: str, wall: float) -> list[str]:
    """The markdown section of ``bench/results/step_profile.md``."""
    import datetime as dt

    s = summary(runs)
    first = next(iter(runs.values()))[0]
    kinds = {
        k: statistics.mean(st[k] for st in first["steps"][1:])
        for k in ("prompt", "generated", "observations", "demonstrations")
    }
    n_dec = first["decoder_params"]
    before = s.get("before", {}).get("seconds")
    tree = s.get("prefix tree", {}).get("seconds")
    lines = [
        "## The multi-turn case: one RL step of `smol-2wiki` on recorded groups",
        "",
        f"Written by `python -m bench.step_profile --case 2wiki` on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC in "
        f"{wall / 60:.1f} min; host: {host}; decoder in {first['precision']} autocast, 2 threads. "
        f"{reps} rounds × {steps} steps per arm (each run's first step dropped), arms alternating; `before` is a "
        f"worktree of {baseline}. Step input: 2 recorded groups (samples with advantage 0 left out) + the recipe's "
        "demonstrations (bench/data/smol-2wiki-step.json.xz).",
        "",
        f"Tokens a step, mean by kind (sft_batch 4): prompt {kinds['prompt']:.0f}, generated {kinds['generated']:.0f}, "
        f"observations {kinds['observations']:.0f}, demonstrations {kinds['demonstrations']:.0f}.",
        "",
        "| arm | s/step (median, range) | vs before | forward s | backward s (with recompute) | optimizer s "
        "| RL tokens through the model / as sequences | peak RSS (MB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, v in s.items():
        ratio = f"{before / v['seconds']:.2f}×" if before else "–"
        lines.append(
            f"| {arm} | {v['seconds']:.1f} ({v['min']:.1f}–{v['max']:.1f}) | {ratio} | {v['forward']:.1f} | "
            f"{v['backward']:.1f} | {v['optimizer']:.2f} | {v['rl_through']:,} / {v['rl_plain']:,} | {v['peak_rss_mb']:,.0f} |"
        )
    gflops = statistics.median(v["gflops"] for v in s.values())
    if "before" in s:
        b = s["before"]
        through = statistics.mean(
            st["rl_tokens_through_model"] + st["demonstrations"] for r in runs["before"] for st in r["steps"][1:]
        )
        fwd_rate = 2 * n_dec * through / b["forward"] / 1e9
        lines += [
            "",
            f"How close to this CPU's limit (`before`): the decoder's {n_dec / 1e6:.0f} M weights make 2 × {n_dec / 1e6:.0f} M "
            f"FLOPs a token forward; {through:,.0f} tokens in {b['forward']:.1f} s of forward is {fwd_rate:.0f} GFLOP/s "
            f"against {gflops:.0f} GFLOP/s for a 2048² bf16 matmul here ({fwd_rate / gflops:.0%}). Backward with "
            f"recompute took {b['backward'] / b['forward']:.1f}× the forward. Publishing the adapter "
            f"(save_pretrained) took {b['publish']:.2f} s.",
        ]
    if before and tree:
        lines += [
            "",
            f"The prefix tree alone: {before / tree:.2f}× the steps per second of `before` (same gradient: "
            "tests/unit/trainer/test_prefix_tree.py).",
        ]
    lines.append("")
    return lines
