"""Real multi-hop QA (HotpotQA and 2WikiMultihopQA dev): every method on the same held-out questions.

    .venv/bin/python bench/qa.py                                   # the recorded run (bench/results/qa.md)
    .venv/bin/python bench/qa.py --datasets hotpotqa --methods zero-shot naive-rag --limit 40   # a quick look

Methods (all evaluated greedily on the dataset's fixed held-out split, ``bundled:<name>-dev``; the first
``--limit`` of its questions, or all of them):
- ``zero-shot``: SmolLM2-135M-Instruct untrained, with the flat search protocol (it may search);
- ``naive-rag``: untrained, the top-3 passages for the question itself, one answer turn;
- ``sft``: SFT only on the demonstrations (make-sft, train split) for the whole budget;
- ``flat``: the flat Search-R1 agent, a warm start of ``--warm-steps`` SFT steps, then GRPO + RED;
- ``coda``: CoDA's planner + executor, the same warm start (CoDA demonstrations), then GRPO + RED.
Every trained method gets the same demonstrations (every kept training question's) and the same
``--train-s`` seconds of training wall time, warm start included, measured from the trainer's start to its
exit (its checkpoint included); the evals are outside it. Each trained method runs once per ``--seeds`` seed.

For each run the bench keeps every question's EM, F1, searches, generated tokens and type, and the training
runs' seconds per step and peak RSS per service; ``bench/results/qa.md`` (tables with 95% bootstrap
intervals, overall and by question type) and ``qa.json`` (the raw numbers) are rewritten after every run, so
an interrupted bench leaves what it measured. A run already in ``qa.json`` is not run again (``--fresh``).
One timed job at a time: two on 2 cores measure neither.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)

import psutil  # noqa: E402
import torch  # noqa: E402

from recipes import get_agent  # noqa: E402
from services.stack.config import StackSettings  # noqa: E402
from services.stack.prepare import Layout  # noqa: E402
from services.stack.processes import threads_for  # noqa: E402
from services.stack.report import read_eval, read_log  # noqa: E402
from services.stack.supervisor import Supervisor  # noqa: E402
from services.stack.train import LocalStack  # noqa: E402
from services.trainer.config import TrainerSettings  # noqa: E402
from shared.precision import compute_dtype  # noqa: E402
from shared.settings import read_recipe  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from _peer_trl_parts import tree_rss  # noqa: E402
from _qa_report import DATASETS, METHODS, TRAINED, delegations, write_report  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MANY_STEPS = "100000"  # trained methods stop on wall time, not on a step count
# Each stack job (make-sft, the eval) may run this long. The recipes' 1800 s is for make train; a CoDA eval of
# 150 held-out questions (a planner turn per hop, an executor per sub-question) took longer than that here.
JOB_TIMEOUT_S = 4 * 3600.0


def say(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, flush=True)


def recipe_of(dataset: str, method: str) -> str:
    return str(ROOT / "configs" / f"{DATASETS[dataset][2 if method == 'coda' else 1]}.toml")


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        self.root = Path(args.root).resolve()
        self.json = RESULTS / f"{args.name}.json"
        self.doc = json.loads(self.json.read_text()) if self.json.is_file() and not args.fresh else {}
        self.doc.setdefault("runs", {})
        self.doc["config"] = {
            "train_s": args.train_s,
            "warm_steps": args.warm_steps,
            "limit": args.limit,
            "seeds": args.seeds,
            "machine": f"{os.cpu_count()} CPU cores, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        }

    # ---------------------------------------------------------------- pieces
    def stack(self, dataset: str, method: str, run: Path) -> LocalStack:
        recipe = recipe_of(dataset, method)
        settings = StackSettings.load(recipe)
        settings = settings.model_copy(update={"train_timeout_s": max(settings.train_timeout_s, JOB_TIMEOUT_S)})
        agent = read_recipe(recipe)["rollout"]["agent"]
        layout = Layout.for_run(run, settings, get_agent(agent).demonstrations or "search")
        layout = dataclasses.replace(layout, evals=run / "eval")  # model, index, demonstrations: cached, shared
        run.mkdir(parents=True, exist_ok=True)
        return LocalStack(recipe, settings, run=run, layout=layout, say=say)

    def evaluate(self, stack: LocalStack, sup: Supervisor, dataset: str, policy: str, **env: str) -> dict:
        """The greedy held-out eval, alone on the machine: the inference server is restarted with every core
        (during training it has one, beside the trainer), and the last published adapter loaded into it."""
        serving = next(s for s in sup.services if s.name == "inference")
        sup.stop(serving)
        fresh = stack.inference_service()
        cores = str(os.cpu_count() or 1)
        fresh.env.update(OMP_NUM_THREADS=cores, CODA_INFERENCE_THREADS=cores)  # the server's own default is 1
        sup.start(fresh)
        if policy == "live":
            reload_last_adapter(stack)
        out = stack.layout.evals / "final"
        args = ["services.rollout", "eval", "--dataset", DATASETS[dataset][0], "--split", "eval"]
        args += ["--eval-output", str(out), "--eval-policy", policy]
        args += ["--eval-limit", str(self.a.limit)] if self.a.limit else []  # the first N, in file order
        started = time.time()
        stack.job(sup, "eval", args, **env)
        result = read_eval(out)
        say(f"{dataset}: {result.headline()} ({time.time() - started:.0f}s)")
        rows = json.loads(result.path.read_text())["rows"]
        return {
            "eval_s": round(time.time() - started, 1),
            "failed": result.failed,
            "rows": [
                {
                    "id": r["prompt_id"],
                    "type": r.get("type", "unknown"),
                    "em": r["em"],
                    "f1": r["f1"],
                    "searches": r.get("searches", 0),
                    "tokens": r.get("generated_tokens", 0),
                    "hit": r.get("search_hit"),
                    **delegations(r),
                }
                for r in rows
            ],
            "example": next((r for r in rows if r["f1"] == 1.0 and r.get("type") == "bridge"), None),
        }

    def train_for(self, stack: LocalStack, sup: Supervisor, seconds: float, rl: bool, peaks: dict, **env: str) -> float:
        """Trainer (+ rollout when ``rl``) until ``seconds`` have passed or the trainer exits (``max_steps``);
        returns the seconds they ran. ``peaks`` collects each service's peak RSS (MB, with its children)."""
        if not rl:  # demonstrations only: the trainer is alone, as make train's warm start (every core)
            env.setdefault("OMP_NUM_THREADS", str(threads_for("trainer", alone=True)))
        started = time.time()
        trainer = sup.start(stack.trainer_service(**env))
        rollout = (
            sup.start(stack.service("rollout", ["services.rollout", "serve"], stack.ports.rollout, **env))
            if rl
            else None
        )
        while trainer.proc.poll() is None and time.time() - started < seconds:
            for other in sup.services:
                if other is not trainer and other.proc.poll() is not None:
                    raise RuntimeError(f"{other.name} exited with {other.proc.returncode}:\n{other.tail()}")
                peaks[other.name] = max(peaks.get(other.name, 0.0), tree_rss(other.proc.pid) / 2**20)
            peaks["trainer"] = max(peaks.get("trainer", 0.0), tree_rss(trainer.proc.pid) / 2**20)
            time.sleep(0.5)
        if rollout is not None:
            sup.stop(rollout)
        sup.stop(trainer)
        if trainer.proc.returncode not in (0, None) and trainer.proc.returncode > 0:
            raise RuntimeError(f"trainer exited with {trainer.proc.returncode}:\n{trainer.tail()}")
        return time.time() - started

    # ---------------------------------------------------------------- methods
    def untrained(self, dataset: str, method: str) -> dict:
        run = self.root / dataset / method
        shutil.rmtree(run, ignore_errors=True)
        stack = self.stack(dataset, method, run)
        env = {"CODA_ROLLOUT_AGENT": "naive-rag"} if method == "naive-rag" else {}
        with Supervisor(run / "logs") as sup:
            stack.prepare(sup)
            stack.start_servers(sup)
            return {"train_s": 0.0, **self.evaluate(stack, sup, dataset, "base", **env)}

    def trained(self, dataset: str, method: str, seed: int) -> dict:
        run = self.root / dataset / f"{method}-seed{seed}"
        shutil.rmtree(run, ignore_errors=True)
        stack = self.stack(dataset, method, run)
        peaks: dict[str, float] = {}
        with Supervisor(run / "logs") as sup:
            stack.prepare(sup)
            stack.start_servers(sup)
            sft = stack.make_sft(sup)
            env = {
                "CODA_TRAINER_SFT_DATA": str(sft),
                "CODA_TRAINER_CHECKPOINT_EVERY": MANY_STEPS,  # one checkpoint, when stopped
                "CODA_TRAINER_SEED": str(seed),
                "CODA_ROLLOUT_SEED": str(seed),
            }
            sft_only = {"CODA_TRAINER_SFT_ONLY": "true", "CODA_TRAINER_RED_MODE": "fixed"}
            if method == "sft":
                used = self.train_for(
                    stack, sup, self.a.train_s, False, peaks, **env, **sft_only, CODA_TRAINER_MAX_STEPS=MANY_STEPS
                )
                warm_s = 0.0
            else:
                warm_s = self.train_for(
                    stack,
                    sup,
                    self.a.train_s,
                    False,
                    peaks,
                    **env,
                    **sft_only,
                    CODA_TRAINER_MAX_STEPS=str(self.a.warm_steps),
                )
                used = warm_s + self.train_for(
                    stack, sup, self.a.train_s - warm_s, True, peaks, **env, CODA_TRAINER_MAX_STEPS=MANY_STEPS
                )
            rec = {"train_s": round(used, 1), "warm_s": round(warm_s, 1), "peak_rss_mb": peaks}
            rec["precision"] = matmul_precision(recipe_of(dataset, method), self.a.set)
            rec.update(step_stats(run / "trainer" / "train.jsonl"))
            say(f"{dataset} {method} seed {seed}: {rec['steps']} steps in {used:.0f}s")
            rec.update(self.evaluate(stack, sup, dataset, "live"))
        return rec

    # ---------------------------------------------------------------- all
    def run(self) -> None:
        for dataset in self.a.datasets:
            for i, seed in enumerate(self.a.seeds):
                methods = self.a.methods if i % 2 == 0 else list(reversed(self.a.methods))
                for method in methods:
                    if method not in TRAINED and i > 0:
                        continue  # greedy and untrained: one run is the result
                    key = f"{dataset}/{method}" + (f"/{seed}" if method in TRAINED else "")
                    if key in self.doc["runs"] and not self.a.again:
                        say(f"{key}: already measured")
                        continue
                    say(f"{key}: {'training ' + str(self.a.train_s) + ' s' if method in TRAINED else 'evaluating'}")
                    started = time.time()
                    rec = self.trained(dataset, method, seed) if method in TRAINED else self.untrained(dataset, method)
                    rec["wall_s"] = round(time.time() - started, 1)
                    rec["commit"] = commit() + "".join(f" {pair}" for pair in self.a.set)
                    self.doc["runs"][key] = rec
                    self.save()

    def save(self) -> None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.json.write_text(json.dumps(self.doc, indent=0))
        write_report(self.doc, RESULTS / f"{self.a.name}.md")


def reload_last_adapter(stack: LocalStack) -> None:
    """Load the adapter the trainer published last into the (restarted) inference server, under its name."""
    import redis

    from shared.inference_client import SyncInferenceClient
    from shared.protocol import WeightUpdate
    from shared.stream import decode

    client = redis.Redis(port=stack.ports.redis)
    last = client.xrevrange("weights", count=1)
    client.close()
    if not last:
        raise RuntimeError("the trainer published no weights")
    update = decode(WeightUpdate, last[0][1])
    if update.kind != "lora":
        raise RuntimeError(f"bench/qa.py evaluates LoRA runs; the last publish was {update.kind}")
    SyncInferenceClient(stack.url(stack.ports.inference)).load_lora(update.model_name, update.path)


def commit() -> str:
    """The commit the run measured (recipes change between runs: the report names what each row ran)."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "configs"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() + ("+configs" if dirty.stdout.strip() else "")


def matmul_precision(recipe: str, sets: list[str]) -> str:
    """What the trainer computed in: its ``precision`` (--set over the trainer's own settings: environment,
    recipe, default) resolved on this CPU. auto means bf16 autocast on a CPU that multiplies bf16 natively
    (shared.precision), and that alone changes the seconds of a step several-fold between machines."""
    named = dict(pair.split("=", 1) for pair in sets)
    precision = TrainerSettings.load(recipe, precision=named.get("CODA_TRAINER_PRECISION")).precision
    return "bf16" if compute_dtype(precision, "cpu") == torch.bfloat16 else "fp32"


def step_stats(log_file: Path) -> dict:
    """Steps made; seconds per RL step, wall (between consecutive RL steps' records: waiting for rollouts
    included) and the trainer's own compute; the reward of the first and last steps."""
    rows = [r for r in read_log(log_file) if "step" in r]
    rl = [r for r in rows if "reward_mean" in r]
    rewards = [r["reward_mean"] for r in rl]
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(rl) if b["step"] == a["step"] + 1]
    compute = [r["step_seconds"] for r in rl if "step_seconds" in r]
    return {
        "steps": len(rows),
        "rl_steps": len(rl),
        "s_per_rl_step": sum(gaps) / len(gaps) if gaps else None,
        "compute_s_per_rl_step": sum(compute) / len(compute) if compute else None,
        "reward_first": sum(rewards[:5]) / len(rewards[:5]) if rewards else None,
        "reward_last": sum(rewards[-5:]) / len(rewards[-5:]) if rewards else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default="runs/qa", help="where the runs are written")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="one run of each trained method per seed")
    p.add_argument("--train-s", type=float, default=600.0, help="training wall time of each trained run")
    p.add_argument("--warm-steps", type=int, default=10, help="SFT-only steps before GRPO + RED (inside --train-s)")
    p.add_argument(
        "--limit",
        type=int,
        default=150,
        help="evaluate the first N held-out questions (default 150: all 312 take 8-10 min a method here; 0: all)",
    )
    p.add_argument("--fresh", action="store_true", help="forget qa.json's runs and measure them again")
    p.add_argument(
        "--again",
        action="store_true",
        help="measure the runs these --datasets/--methods/--seeds name again, keeping qa.json's others",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for every service of the runs, as an environment variable over the recipes (e.g. "
        "CODA_TRAINER_ADVANTAGE=dr_grpo); recorded with each run; use with --name to keep qa.json's arms apart",
    )
    p.add_argument("--report-only", action="store_true", help="rewrite NAME.md from NAME.json")
    p.add_argument("--name", default="qa", help="results file stem under bench/results (default: qa)")
    args = p.parse_args()
    if args.report_only:
        write_report(json.loads((RESULTS / f"{args.name}.json").read_text()), RESULTS / f"{args.name}.md")
        return
    for pair in args.set:
        name, sep, value = pair.partition("=")
        if not sep or not name.startswith("CODA_"):
            p.error(f"--set {pair!r}: expected CODA_<SERVICE>_<FIELD>=VALUE")
        os.environ[name] = value  # the services inherit the bench's environment (Supervisor)
    Bench(args).run()


if __name__ == "__main__":
    main()
