"""The CUDA path end to end: `make train`'s real-model recipe with the trainer (DeepSpeed, bf16, LoRA) and our
inference server on one GPU, a few RL steps, a publish after each and the sync check after each publish.

    python -m bench.gpu_check                       # on a host with a CUDA GPU
    python -m bench.gpu_check --random-weights-from DIR

→ bench/results/gpu.md (+ gpu.json, the logs under --work). ``--random-weights-from`` builds the recipe's model
folder from DIR's config and tokenizer with random weights: for a GPU machine that can reach neither the hub
nor PyPI, where the imported SmolLM2 (514 MB) is too large to carry. The shapes, the chat template, LoRA, the
publish and the sync check are then those of the real model; rewards mean nothing (an untrained policy).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench._peer_trl_parts import ROOT, clean_env, launch

log = logging.getLogger("gpu_check")
RECIPE = ROOT / "configs" / "smol-cpu.toml"
SYNC = re.compile(r"sync check.*?max_abs_diff=([0-9.eE+-]+)")


def random_model(source: Path, out: Path, seed: int = 0) -> None:
    """``out`` = ``source``'s config, tokenizer and chat template with freshly initialised weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".bin", ".gguf")):
            shutil.copy2(f, out / f.name)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source), dtype=torch.float32)
    model.save_pretrained(out)


class GpuSampler(threading.Thread):
    """Peak GPU memory in use (MiB) from nvidia-smi once a second: the whole GPU's, and each service's (by the
    ``-m services.X`` of the process that holds it)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_mib, self.by_service, self.done = 0, {}, threading.Event()

    def run(self) -> None:
        if shutil.which("nvidia-smi") is None:
            return
        while not self.done.wait(1.0):
            total = _smi("--query-gpu=memory.used")
            if total:
                self.peak_mib = max(self.peak_mib, int(total[0][0]))
            for pid, used in _smi("--query-compute-apps=pid,used_memory"):
                name = _service(int(pid))
                self.by_service[name] = max(self.by_service.get(name, 0), int(used))


def _smi(query: str) -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True)
    if out.returncode != 0:
        return []
    return [[x.strip() for x in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def _service(pid: int) -> str:
    import psutil

    try:
        cmd = psutil.Process(pid).cmdline()
    except psutil.Error:
        return f"pid {pid}"
    return next((c.removeprefix("services.") for c in cmd if c.startswith("services.")), f"pid {pid}")


def device_info() -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {"gpu": props.name, "gpu_mem_gib": round(props.total_memory / 2**30, 1)}
    return info


def service_lines(folder: Path) -> list[str]:
    """Every log line of the run's services."""
    return [line for f in sorted(folder.rglob("*.log")) for line in f.read_text().splitlines()]


def summarise(folder: Path | None, code: int, wall_s: float, gpu: GpuSampler, peak_rss_mb: float) -> dict:
    result = {
        "exit_code": code,
        "wall_s": round(wall_s, 1),
        "peak_gpu_mib": gpu.peak_mib,
        "peak_gpu_mib_by_service": gpu.by_service,
        "peak_rss_mb": peak_rss_mb,
    }
    if folder is None:
        return result
    steps = folder / "trainer" / "train.jsonl"
    records = [json.loads(x) for x in steps.read_text().splitlines()] if steps.is_file() else []
    lines = service_lines(folder)
    syncs = [float(m.group(1)) for line in lines if (m := SYNC.search(line))]
    rl = [r for r in records if r.get("rl_sequences")]
    result |= {
        "run": str(folder),
        "steps": [r["step"] for r in records],
        "step_seconds": [round(r["step_seconds"], 2) for r in records if "step_seconds" in r],
        "publish_seconds": [round(r["publish_seconds"], 3) for r in records if r.get("publish_seconds")],
        "rl_sequences": sum(r["rl_sequences"] for r in rl),
        "sync_max_abs_diff": syncs,
        "trainer_device": [line for line in lines if "engine ready" in line][-1:],
        "server_device": [line for line in lines if "model loaded" in line][-1:],
    }
    return result


def render(meta: dict, result: dict) -> str:
    def median(key: str) -> str:
        values = result.get(key) or []
        return f"{statistics.median(values):.2f}" if values else "–"

    syncs = result.get("sync_max_abs_diff") or []
    rows = [
        ("exit code of `launcher train`", str(result["exit_code"])),
        ("wall time (setup, index, demonstrations, training)", f"{result['wall_s']:.0f} s"),
        ("trainer steps (the warm start's included)", str(len(result.get("steps", [])))),
        ("RL sequences through the GRPO loss", str(result.get("rl_sequences", 0))),
        ("seconds per step, median", median("step_seconds")),
        ("publish (LoRA adapter → server), median s", median("publish_seconds")),
        ("sync checks: largest abs Δ logprob, each", ", ".join(f"{x:.2e}" for x in syncs) or "none logged"),
        ("peak GPU memory in use (all processes)", f"{result['peak_gpu_mib']} MiB"),
        (
            "peak GPU memory by service",
            ", ".join(f"{k} {v} MiB" for k, v in sorted(result.get("peak_gpu_mib_by_service", {}).items())) or "–",
        ),
        ("peak host RSS of the process tree", f"{result['peak_rss_mb']:.0f} MB"),
    ]
    lines = [
        "# The CUDA path: trainer and our inference server on one GPU",
        "",
        f"`python -m bench.gpu_check {meta['args']}` on {meta.get('gpu', 'no GPU')} (torch {meta['torch']}, "
        f"CUDA {meta['cuda']}), {meta['date']}. Recipe `configs/smol-cpu.toml` (SmolLM2-135M shapes, LoRA r16 on "
        f"the 7 projections, Search-R1 protocol, lookup world) with {meta['overrides']}.",
        "",
        f"Weights: {meta['weights']}.",
        "",
        "| | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in rows],
        "",
        "Where each side ran (their start-up log lines):",
        "",
        *[f"    {line.strip()[:300]}" for line in result.get("trainer_device", []) + result.get("server_device", [])],
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--random-weights-from", type=Path, help="config + tokenizer folder; weights made random")
    parser.add_argument("--steps", type=int, default=8, help="trainer steps in all (2 of them the warm start)")
    parser.add_argument("--timeout-s", type=float, default=420, help="stop the run after this long")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "gpu-check", help="run folders and logs")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gpu.md")
    parser.add_argument("--cpu", action="store_true", help="a dry run of this script on a machine without a GPU")
    parser.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="trainer and server precision (fp32 on both sides tells bf16 rounding from a sync bug)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    info = device_info()
    if "gpu" not in info and not args.cpu:
        sys.exit("no CUDA GPU visible to torch: this bench checks the CUDA path (--cpu: a dry run)")

    overrides = {}
    weights = "SmolLM2-135M-Instruct as `make train` imports it"
    if args.random_weights_from:
        model = args.work / "random-model"
        random_model(args.random_weights_from, model)
        overrides["CODA_STACK_MODEL"] = str(model)
        weights = f"random (seed 0), config and tokenizer of {args.random_weights_from.name}: see the docstring"
    overrides |= {
        "CODA_TRAINER_MAX_STEPS": str(args.steps),
        "CODA_STACK_WARM_START_STEPS": "2",
        "CODA_STACK_EVAL_LIMIT": "0",  # no evals: the check is the training path
        "CODA_TRAINER_SYNC__CHECK": "true",
        # An untrained (or random) policy earns no reward: its groups go through the GRPO loss all the same.
        "CODA_TRAINER_SKIP_ZERO_ADVANTAGE": "false",
        "CODA_TRAINER_CHECKPOINT_EVERY": str(args.steps),
        "CODA_INFERENCE_DEVICE": "cpu" if args.cpu else "cuda",
    }
    if args.precision != "auto":
        overrides |= {"CODA_TRAINER_PRECISION": args.precision, "CODA_INFERENCE_PRECISION": args.precision}
    args.work.mkdir(parents=True, exist_ok=True)
    # The caller's PYTHONPATH stays behind ROOT: a GPU host without network carries its packages that way.
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**clean_env(), **overrides, "PYTHONPATH": pythonpath}
    cmd = [sys.executable, "-m", "launcher", "train", "--recipe", str(RECIPE), "--new"]
    runs = args.work / "runs"
    before = set(runs.glob("*")) if runs.exists() else set()
    sampler = GpuSampler()
    sampler.start()
    log.info("running %s (timeout %.0f s)", " ".join(cmd), args.timeout_s)
    start, code, rss, _ = launch([*cmd, "--run-root", str(runs)], env, args.work / "stack.log", ROOT, args.timeout_s)
    sampler.done.set()
    folders = sorted(set(runs.glob("*")) - before) if runs.exists() else []
    result = summarise(folders[-1] if folders else None, code, time.time() - start, sampler, rss)
    meta = info | {
        "args": " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "weights": weights,
        "overrides": ", ".join(f"`{k}={v}`" for k, v in overrides.items()),
    }
    args.out.write_text(render(meta, result))
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "result": result}, indent=1) + "\n")
    log.info("wrote %s: %s", args.out, json.dumps(result)[:2000])
    sys.exit(0 if code == 0 and result.get("sync_max_abs_diff") else 1)


if __name__ == "__main__":
    main()
