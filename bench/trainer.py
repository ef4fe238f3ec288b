"""Trainer benchmark: packing vs padding throughput, weight-publish latency, 2-process DeepSpeed on CPU.

1. Tokens/s of one training step (forward + backward + AdamW) on the same batch laid out two ways, measured
   side by side in one process: packed rows (samples back to back, no cross-attention) vs one padded row
   per sample. The batch has the length spread of agent trajectories (log-normal, 40–1024 tokens).
2. Weight-publish latency against the real CPU inference server: full weights (safetensors written
   atomically by the trainer's ``Publisher`` + the rollout loader's ``/collective_rpc`` reload) and a LoRA
   adapter (saved + ``/v1/load_lora_adapter``).
3. ``torchrun --nproc_per_node 2`` on CPU (gloo): ZeRO-2 and ZeRO-3 runs of the trainer CLI from Redis.

    .venv/bin/python -m bench.trainer                  # writes bench/results/trainer.md
    .venv/bin/python -m bench.trainer --size small --repeats 3 --skip-multiproc
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "trainer.md"
RAW = REPO / "bench" / "results" / "trainer.json"  # sections skipped in a run are kept from the last one


def lengths(rng: random.Random, n: int) -> list[int]:
    return [max(40, min(1024, int(rng.lognormvariate(5.3, 0.7)))) for _ in range(n)]


def make_batch(rng: random.Random, vocab: int, n: int):
    from services.trainer.packing import TrainSeq

    seqs = []
    for i, length in enumerate(lengths(rng, n)):
        prompt = min(length // 3, 120)
        tokens = [rng.randrange(vocab) for _ in range(length)]
        fields = {"old_logp": [-8.0] * length, "adv": [rng.uniform(-1, 1)] * length, "staleness": [0.0] * length}
        seqs.append(TrainSeq(tokens, [0] * prompt + [1] * (length - prompt), fields, i))
    return seqs


def bench_packing(model_dir: Path, samples: int, budget: int, repeats: int) -> dict:
    from services.trainer.config import TrainerSettings
    from services.trainer.engine import build_engine, init_distributed
    from services.trainer.step import Objective, StepInput, layout, train_step

    settings = TrainerSettings(model=str(model_dir), lr=1e-5, micro_batch_tokens=budget)
    eng = build_engine(settings, init_distributed())
    vocab = eng.lm.config.vocab_size
    seqs = make_batch(random.Random(0), vocab, samples)
    real = sum(len(s.tokens) for s in seqs)
    out: dict = {"samples": samples, "real_tokens": real, "budget": budget}
    objective = Objective(settings)
    train_step(eng, StepInput(seqs[:4]), objective, None, budget, packing=True)  # warm-up
    times: dict[str, list[float]] = {"packed": [], "padded": []}
    for _ in range(repeats):  # interleaved, so drift in machine load hits both layouts alike
        for mode in ("packed", "padded"):
            start = time.perf_counter()
            train_step(eng, StepInput(seqs), objective, None, budget, packing=mode == "packed")
            times[mode].append(time.perf_counter() - start)
    for mode in ("packed", "padded"):
        batches = layout(seqs, budget, mode == "packed")
        slots = sum(b.num_slots for b in batches)
        best = min(times[mode])
        out[mode] = {
            "seconds": best,
            "tokens_per_s": real / best,
            "micro_batches": len(batches),
            "slots": slots,
            "fill": real / slots,
        }
    out["speedup"] = out["packed"]["tokens_per_s"] / out["padded"]["tokens_per_s"]
    return out


def bench_publish(model_dir: Path, work: Path, repeats: int) -> dict:
    from services.rollout.loader import load_into, unload_from
    from services.trainer.config import TrainerSettings
    from services.trainer.engine import build_engine, init_distributed
    from services.trainer.publish import Publisher
    from shared.inference_sync import SyncInferenceClient
    from tests.integration.trainer.harness import start_server

    def publish_and_load(pub: Publisher, version: int) -> float:
        """The trainer's write, then the rollout's load: from save start to served."""
        start = time.perf_counter()
        event = pub.publish(version, version)
        load_into(url, event.kind, event.model_name, event.path, event.version)
        seconds = time.perf_counter() - start
        if event.kind == "lora" and version >= 2:  # the server holds max_loras: keep the trainer's window of 2
            unload_from(url, pub.model_name(version - 2))
        return seconds

    server, url = start_server(model_dir, work)
    out = {}
    try:
        with SyncInferenceClient(url) as client:
            client.wait_ready(180)
            for kind in ("full", "lora"):
                settings = TrainerSettings(model=str(model_dir), finetune=kind, lora={"rank": 16})
                eng = build_engine(settings, init_distributed())
                pub = Publisher(eng.engine, str(work / f"w-{kind}"), kind, None, "weights", "policy:version", keep=2)
                seconds = [publish_and_load(pub, v) for v in range(repeats)]
                params = sum(p.numel() for p in eng.policy.parameters() if p.requires_grad)
                out[kind] = {"median_s": statistics.median(seconds), "max_s": max(seconds), "trainable": params}
    finally:
        server.terminate()
        server.wait(30)
    return out


def bench_multiproc(model_dir: Path, work: Path, steps: int) -> dict:
    """2 ranks per run, publishing for the real server (the rollout's weight sync loads each version into it)
    with the sync check after every publish."""
    import json

    from shared.inference_sync import SyncInferenceClient
    from shared.protocol import TrajectoryGroup
    from shared.redis_server import RedisServer, free_port
    from shared.stream import StreamQueue
    from tests.integration.trainer.harness import random_group, start_server, start_weight_sync, trainer_env

    out = {}
    server, url = start_server(model_dir, work)
    with SyncInferenceClient(url) as llm:
        llm.wait_ready(180)
    with RedisServer() as redis_server:
        client = redis_server.client()
        for stage in (2, 3):
            client.flushall()
            queue = StreamQueue(client, "trajectories", TrajectoryGroup)
            rng = random.Random(stage)
            for i in range(steps * 4):
                queue.publish(random_group(rng, i))
            run = work / f"zero{stage}"
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                "2",
                "--master_port",
                str(free_port()),
                "-m",
                "services.trainer",
                "train",
                "--model",
                str(model_dir),
                "--redis-url",
                redis_server.url,
                "--zero-stage",
                str(stage),
                "--groups-per-step",
                "4",
                "--max-steps",
                str(steps),
                "--checkpoint-dir",
                str(run / "ckpt"),
                "--weights-dir",
                str(run / "w"),
                "--log-dir",
                str(run / "logs"),
                "--port",
                "0",
                "--max-staleness",
                "1000",
                "--micro-batch-tokens",
                "256",
                "--inference-url",
                url,
                "--sync-check",
                "true",
            ]
            run.mkdir(parents=True, exist_ok=True)
            sync = start_weight_sync(redis_server.url, url, run / "weight-sync.log")  # a fresh Redis: a fresh one
            start = time.perf_counter()
            try:
                proc = subprocess.run(cmd, cwd=REPO, env=trainer_env(), capture_output=True, text=True, timeout=900)
            finally:
                sync.terminate()
                sync.wait(30)
            wall = time.perf_counter() - start
            ok = proc.returncode == 0 and f"trained {steps} steps" in proc.stdout
            version = client.get("policy:version")
            log = run / "logs" / "train.jsonl"
            diffs = (
                [json.loads(x).get("sync_max_abs_diff", float("nan")) for x in log.read_text().splitlines()]
                if log.is_file()
                else [float("nan")]
            )
            out[stage] = {
                "ok": ok,
                "wall_s": wall,
                "version": None if version is None else int(version),
                "sync": max(diffs),
                "tail": "" if ok else (proc.stdout + proc.stderr)[-2000:],
            }
    server.terminate()
    server.wait(30)
    return out


def write(results: dict, args) -> str:
    p = results["packing"]
    lines = [
        "# Trainer benchmark",
        "",
        "Written by `python -m bench.trainer`; model "
        f"`make-tiny --size {args.size}` ({results['params']:,} parameters), CPU, fp32, torch threads "
        f"{results.get('threads', 'default')}. Numbers are what the script measured on a shared 2-core "
        "machine (other jobs were running), best of the repeats; each section says when it ran (`--skip-…` "
        "keeps a section from an earlier run).",
        "",
        "## Packing vs padding (one optimizer step: forward + backward + AdamW)",
        "",
        f"Measured {results.get('measured_at', {}).get('packing', '?')}.",
        "",
        f"{p['samples']} samples, {p['real_tokens']:,} real tokens, lengths log-normal in [40, 1024]; micro-batch "
        f"budget {p['budget']} token slots.",
        "",
        "| layout | micro-batches | token slots | fill | step s | real tokens/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for mode in ("packed", "padded"):
        m = p[mode]
        lines.append(
            f"| {mode} | {m['micro_batches']} | {m['slots']:,} | {m['fill']:.0%} | {m['seconds']:.2f} | "
            f"{m['tokens_per_s']:,.0f} |"
        )
    lines += ["", f"**Packing speed-up: {p['speedup']:.2f}×** (target ≥ 1.5×).", ""]
    if "publish" in results:
        lines += [
            "## Weight publish latency (write atomically → server loads → live)",
            "",
            f"Measured {results.get('measured_at', {}).get('publish', '?')}.",
            "",
            "| kind | trainable params | median s | max s |",
            "|---|---:|---:|---:|",
        ]
        for kind, m in results["publish"].items():
            lines.append(f"| {kind} | {m['trainable']:,} | {m['median_s']:.3f} | {m['max_s']:.3f} |")
        lines.append("")
    if "multiproc" in results:
        lines += [
            "## 2 processes (torchrun, gloo, CPU), publishing full weights into the real server",
            "",
            f"Measured {results.get('measured_at', {}).get('multiproc', '?')}; 3 optimizer steps each.",
            "",
            "| ZeRO stage | finished | wall s (incl. start-up) | policy version | max abs logprob diff "
            "server vs trainer after each publish |",
            "|---|---|---:|---:|---:|",
        ]
        for stage, m in results["multiproc"].items():
            lines.append(
                f"| {stage} | {'yes' if m['ok'] else 'NO'} | {m['wall_s']:.1f} | {m['version']} | {m['sync']:.1e} |"
            )
        lines.append("")
    text = "\n".join(lines)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=["tiny", "small", "base"], default="small", help="make-tiny model size")
    parser.add_argument("--samples", type=int, default=32, help="samples in the benchmark batch")
    parser.add_argument("--budget", type=int, default=4096, help="token slots per micro-batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (best is reported)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps of each multi-process run")
    parser.add_argument("--skip-packing", action="store_true", help="keep the last run's packing section")
    parser.add_argument("--skip-publish", action="store_true", help="keep the last run's publish section")
    parser.add_argument("--skip-multiproc", action="store_true", help="keep the last run's multi-process section")
    args = parser.parse_args()
    import json

    from services.inference.factory import build_tiny_model, count_parameters, read_texts

    results = json.loads(RAW.read_text()) if RAW.is_file() else {}
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        work = Path(tmp)
        model = build_tiny_model(work / "model", read_texts(["data/hotpotqa/corpus.jsonl"], limit=2000), args.size)
        results["params"] = count_parameters(model)
        results["threads"] = os.environ.get("OMP_NUM_THREADS", "default")
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        measured = results.setdefault("measured_at", {})
        if not args.skip_packing:
            results["packing"] = bench_packing(model, args.samples, args.budget, args.repeats)
            measured["packing"] = stamp
        if not args.skip_publish:
            results["publish"] = bench_publish(model, work, max(args.repeats, 3))
            measured["publish"] = stamp
        if not args.skip_multiproc:
            results["multiproc"] = bench_multiproc(model, work, args.steps)
            measured["multiproc"] = stamp
            for stage, m in results["multiproc"].items():
                if not m["ok"]:
                    print(f"ZeRO-{stage} run failed:\n{m['tail']}", file=sys.stderr)
    RAW.write_text(json.dumps(results, indent=1))
    print(write(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
