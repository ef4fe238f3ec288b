"""The RED ablations on the real model, at equal wall time: what RL adds after a warm start on demonstrations.

    .venv/bin/python -m bench.ablation     # 4 arms x 2 seeds, 2 evals each: 71 min on 2 CPU cores (the recorded run)
    .venv/bin/python -m bench.ablation --train-s 120 --seeds 0 --arms sft red   # a quick look

1. One warm start, shared by every arm: the ``sft`` arm (SFT only, no rollouts) for
   ``--warm-steps`` steps from SmolLM2-135M-Instruct, checkpointed once and evaluated once. Every arm that
   uses demonstrations (the warm start, SFT only, fixed, RED) cycles through the same ones: the recipes'
   ``[stack] sft_limit`` (a budget of 4: what a user who writes them by hand has; 0 = one per training
   question, ``bench/results/ablation-all-demos.md``).
2. Each arm (``bench/_ablation_arms.py``: ``configs/smol-cpu.toml`` with only ``[trainer.red] mode`` / ``sft_only``
   overridden, and one budget) starts from a copy of that checkpoint (weights, optimizer state, demonstration cursor;
   not its RNG state, so ``--seeds`` differ) with its own Redis, inference server and retriever, and trains for
   ``--train-s`` seconds of wall time, cut into ``--segments`` pieces: after each the trainer and the rollout
   are stopped (the trainer checkpoints), the adapter it published last is evaluated greedily on the lookup
   world's 72 held-out questions, and training resumes from the checkpoint. Only the time the trainer (and
   the rollout, for the RL arms) runs counts as training time; the evals are outside it.
3. After the last segment, the same adapter on a fixed subset of the bundled HotpotQA questions (their own
   BM25 index; ``--hotpot 0``: skip).
4. ``bench/results/ablation.md`` (a table) and ``ablation.png`` (held-out F1 against training wall time, one
   line per arm) are rewritten after every run, so an interrupted bench leaves what it measured; the raw
   numbers go to ``ablation.json`` (``--name``: another stem). A run already there is not run again
   (``--fresh``: redo).

Arms run interleaved (seed 0: the order given, seed 1: reversed, ...) because the machine is shared.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from bench._ablation_arms import SMOL as ARMS  # noqa: E402
from bench._ablation_report import write_report  # noqa: E402
from launcher import (  # noqa: E402
    Layout,
    LocalStack,
    StackSettings,
    Supervisor,
    checkpoint_step,
    eval_args,
    read_eval,
    read_log,
    start_from_checkpoint,
)
from shared.redis_server import free_port  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MANY_STEPS = "100000"  # the arms stop on wall time, not on a step count


def recipe(arm: str) -> str:
    """The user recipe the arm overrides (every arm: the same one)."""
    return str(ROOT / ARMS[arm].recipe)


def say(message: str) -> None:
    print(time.strftime("%H:%M:%S"), message, flush=True)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        self.root = Path(args.root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.settings = StackSettings.load(recipe("sft"))
        self.layout = Layout.for_run(self.root, self.settings)  # model, lookup index, demonstrations: shared
        self.hotpot_index = ROOT / "runs" / "index" / "hotpotqa-bench"  # shared by every bench root
        self.json = RESULTS / f"{args.name}.json"
        self.doc = json.loads(self.json.read_text()) if self.json.is_file() and not args.fresh else {}
        self.doc.setdefault("runs", {})
        self.doc["config"] = {
            "train_s": args.train_s,
            "segments": args.segments,
            "warm_steps": args.warm_steps,
            "hotpot": args.hotpot,
            "hotpot_seeds": args.hotpot_seeds,
            "eval_limit": self.settings.eval_limit,
            "sft_limit": self.settings.sft_limit,
        }

    # ---------------------------------------------------------------- pieces
    def stack(self, arm: str, run: Path) -> LocalStack:
        run.mkdir(parents=True, exist_ok=True)
        layout = dataclasses.replace(self.layout, evals=run / "eval")
        return LocalStack(recipe(arm), self.settings, run=run, layout=layout, say=say)

    def trainer_env(self, seed: int, max_steps: str) -> dict[str, str]:
        return {
            "CODA_TRAINER_SFT_DATA": str(self.layout.sft),
            "CODA_TRAINER_MAX_STEPS": max_steps,
            "CODA_TRAINER_CHECKPOINT_EVERY": MANY_STEPS,
            "CODA_TRAINER_SEED": str(seed),
            "CODA_ROLLOUT_SEED": str(seed),
        }

    def evaluate(self, stack: LocalStack, sup: Supervisor, label: str, hotpot: bool = False) -> dict:
        out = stack.layout.evals / label
        started = time.time()
        if not hotpot:
            stack.job(sup, f"eval-{label}", eval_args(self.settings, out))
        else:
            port = free_port()
            retriever = sup.start(stack.retriever_service(self.hotpot_index, port, name="retriever-hotpot"))
            args = [
                "services.rollout",
                "eval",
                "--dataset",
                "bundled:hotpotqa",
                "--split",
                "all",
                "--eval-output",
                str(out),
                "--eval-limit",
                str(self.a.hotpot),
            ]
            stack.job(sup, f"eval-{label}", args, CODA_ROLLOUT_RETRIEVER_URL=stack.url(port))
            sup.stop(retriever)
        result = read_eval(out)
        say(f"{label}: {result.headline()} ({time.time() - started:.0f}s)")
        extra = {} if hotpot else {"by_relation": f1_by_relation(result.path)}
        return {
            **result.metrics,
            **extra,
            "n": result.n,
            "failed": result.failed,
            "eval_s": round(time.time() - started, 1),
        }

    def train_for(
        self, stack: LocalStack, sup: Supervisor, arm: str, seed: int, seconds: float, max_steps: str = MANY_STEPS
    ) -> float:
        """Trainer (+ rollout for the RL arms) until ``seconds`` have passed or ``max_steps`` are done;
        returns the seconds they ran (from the trainer's start to its exit, its checkpoint included)."""
        env = {**ARMS[arm].env, **self.trainer_env(seed, max_steps)}  # the arm's overrides, then the run's
        started = time.time()
        trainer = sup.start(stack.trainer_service(**env))
        rollout = None
        if arm != "sft":
            rollout = sup.start(stack.rollout_service(**env))
        while trainer.proc.poll() is None and time.time() - started < seconds:
            for other in sup.services:
                if other is not trainer and other.proc.poll() is not None:
                    raise RuntimeError(f"{other.name} exited with {other.proc.returncode}:\n{other.tail()}")
            time.sleep(0.5)
        if rollout is not None:
            sup.stop(rollout)
        sup.stop(trainer)
        if trainer.proc.returncode not in (0, None) and trainer.proc.returncode > 0:
            raise RuntimeError(f"trainer exited with {trainer.proc.returncode}:\n{trainer.tail()}")
        return time.time() - started

    # ---------------------------------------------------------------- the warm start
    def warm(self) -> Path:
        folder = self.root / "warm"
        done = folder / "done.json"
        if done.is_file():
            self.doc["warm"] = json.loads(done.read_text())
            return folder / "checkpoints"
        shutil.rmtree(folder, ignore_errors=True)
        stack = self.stack("sft", folder)
        with Supervisor(folder / "logs") as sup:
            stack.prepare(sup)
            if not self.hotpot_index.is_dir() and self.a.hotpot:
                stack.job(
                    sup,
                    "index-hotpot",
                    [
                        "services.retriever",
                        "build",
                        "--corpus",
                        "data/hotpotqa/corpus.jsonl",
                        "--embeddings",
                        "data/hotpotqa/corpus_emb_all-MiniLM-L6-v2_fp16.npy",
                        "--out",
                        str(self.hotpot_index),
                    ],
                )
            stack.start_servers(sup)
            stack.make_sft(sup)
            seconds = self.train_for(stack, sup, "sft", 0, self.a.train_timeout_s, str(self.a.warm_steps))
            rec = {
                "steps": self.a.warm_steps,
                "train_s": round(seconds, 1),
                "lookup": self.evaluate(stack, sup, "warm"),
            }
            if self.a.hotpot:
                rec["hotpot"] = self.evaluate(stack, sup, "warm-hotpot", hotpot=True)
        done.write_text(json.dumps(rec))
        self.doc["warm"] = rec
        self.save()
        return folder / "checkpoints"

    # ---------------------------------------------------------------- one arm
    def arm(self, arm: str, seed: int, warm: Path) -> dict:
        run = self.root / f"seed{seed}-{arm}"
        shutil.rmtree(run, ignore_errors=True)
        warm_step = start_from_checkpoint(warm, run / "checkpoints")  # the arm's seed, not the warm start's RNG
        stack = self.stack(arm, run)
        rec: dict = {"arm": arm, "seed": seed, "started": time.strftime("%H:%M:%S"), "points": []}
        total = 0.0
        with Supervisor(run / "logs") as sup:
            stack.start_servers(sup)
            for k in range(self.a.segments):
                total += self.train_for(stack, sup, arm, seed, self.a.train_s / self.a.segments)
                step = checkpoint_step(run / "checkpoints")
                point = {
                    "train_s": round(total, 1),
                    "steps": step - warm_step,
                    "lookup": self.evaluate(stack, sup, f"seg{k + 1}"),
                }
                rec["points"].append(point)
                say(
                    f"seed {seed} {arm}: {point['steps']} steps in {total:.0f}s, lookup f1 "
                    f"{point['lookup'].get('f1', float('nan')):.3f}"
                )
            if self.a.hotpot and (self.a.hotpot_seeds is None or seed in self.a.hotpot_seeds):
                rec["hotpot"] = self.evaluate(stack, sup, "final-hotpot", hotpot=True)
        rec.update(self.training_stats(run / "trainer" / "train.jsonl"))
        rec["no_advantage_batches"] = no_advantage_batches(run / "logs" / "trainer.log")
        return rec

    @staticmethod
    def training_stats(log_file: Path) -> dict:
        """What the steps trained on: RL samples, demonstrations, the SFT weight, the rollouts' reward."""
        rows = [r for r in read_log(log_file) if "step" in r]
        rl = [r for r in rows if r.get("rl_tokens", 0) > 0]
        rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]
        weights = [r["red/sft_loss_weight"] for r in rows if "red/sft_loss_weight" in r]
        return {
            "logged_steps": len(rows),
            "rl_steps": len(rl),
            "sft_steps": sum(1 for r in rows if r.get("sft_tokens", 0) > 0),
            "reward_first": sum(rewards[:5]) / len(rewards[:5]) if rewards else None,
            "reward_last": sum(rewards[-5:]) / len(rewards[-5:]) if rewards else None,
            "sft_weight_mean": sum(weights) / len(weights) if weights else None,
        }

    # ---------------------------------------------------------------- all
    def run(self) -> None:
        warm = self.warm()
        self.doc["config"]["demonstrated"] = demonstrated_relations(self.layout.sft)
        say(f"warm start: {self.doc['warm']}")
        for i, seed in enumerate(self.a.seeds):
            order = self.a.arms if i % 2 == 0 else list(reversed(self.a.arms))
            for arm in order:
                key = f"{arm}/{seed}"
                if key in self.doc["runs"]:
                    say(f"{key}: already measured")
                    continue
                say(f"{key}: training {self.a.train_s:.0f}s from the warm start")
                self.doc["runs"][key] = self.arm(arm, seed, warm)
                self.save()

    def save(self) -> None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.json.write_text(json.dumps(self.doc, indent=1))
        write_report(self.doc, RESULTS / f"{self.a.name}.md", RESULTS / f"{self.a.name}.png")


def relation(question_id: str) -> str:
    """A lookup question's relation: the id's last part (``lookup/test/bekdarfen-city`` -> ``city``)."""
    return question_id.rsplit("-", 1)[-1]


def f1_by_relation(eval_json: Path) -> dict[str, float]:
    """Mean F1 of one eval's episodes per relation asked (city, job, pet): which facts the policy answers."""
    scores: dict[str, list[float]] = {}
    for row in json.loads(eval_json.read_text())["rows"]:
        scores.setdefault(relation(row["prompt_id"]), []).append(float(row["f1"]))
    return {rel: sum(xs) / len(xs) for rel, xs in sorted(scores.items())}


def demonstrated_relations(sft_file: Path) -> list[str]:
    """The relations the demonstrations show (each line's ``id`` is its training question's)."""
    lines = sft_file.read_text().splitlines()
    return sorted({relation(json.loads(line)["id"]) for line in lines if line.strip()})


def no_advantage_batches(trainer_log: Path) -> int:
    """Batches of rollouts the trainer left out because every group's rewards were equal (no step made)."""
    if not trainer_log.is_file():
        return 0
    return trainer_log.read_text(errors="replace").count("no RL sample had an advantage")


# -------------------------------------------------------------------- report
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default="runs/ablation", help="where the runs are written")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--warm-steps", type=int, default=10, help="SFT-only steps of the shared warm start")
    p.add_argument("--train-s", type=float, default=240.0, help="training wall time per arm after the warm start")
    p.add_argument("--segments", type=int, default=2, help="evals of the lookup questions during that time")
    p.add_argument("--hotpot", type=int, default=20, help="HotpotQA questions evaluated at the end (0: none)")
    p.add_argument(
        "--hotpot-seeds",
        nargs="+",
        type=int,
        default=None,
        help="only the runs of these seeds get the HotpotQA eval (default: every run)",
    )
    p.add_argument("--train-timeout-s", type=float, default=900.0, help="limit of the warm start's training")
    p.add_argument("--fresh", action="store_true", help="forget ablation.json's runs and measure them again")
    p.add_argument("--report-only", action="store_true", help="rewrite NAME.md/png from NAME.json")
    p.add_argument("--name", default="ablation", help="results file stem under bench/results (default: ablation)")
    args = p.parse_args()
    if args.report_only:
        doc = json.loads((RESULTS / f"{args.name}.json").read_text())
        write_report(doc, RESULTS / f"{args.name}.md", RESULTS / f"{args.name}.png")
        return
    Bench(args).run()


if __name__ == "__main__":
    main()
