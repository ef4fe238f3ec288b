"""Real multi-hop QA (HotpotQA and 2WikiMultihopQA dev): every method on the same held-out questions.

    .venv/bin/python -m bench.qa                                   # the recorded run (bench/results/qa.md)
    .venv/bin/python -m bench.qa --datasets hotpotqa --methods zero-shot naive-rag --limit 40   # a quick look

Methods (``_qa_arms.ARMS``: recipe, training, environment; all evaluated greedily on the dataset's fixed
held-out split, ``bundled:<name>-dev``; the first ``--limit`` of its questions, or all of them):
- ``zero-shot``: SmolLM2-135M-Instruct untrained, with the flat search protocol (it may search);
- ``naive-rag``: untrained, the top-3 passages for the question itself, one answer turn;
- ``naive-rag-4shot``: the same with 4 training questions (one of each type) and their gold answers in the
  system turn;
- ``sft``: SFT only on the flat demonstrations (make-sft, train split) for the whole budget;
- ``rag-sft``: naive RAG fine-tuned (SFT only) on demonstrations of its own one turn: the same questions, the
  retrieved passages in the prompt, the answer alone, no search actions;
- ``flat``: the flat Search-R1 agent, a warm start (the recipe's ``warm_start_steps``), then GRPO + RED;
- ``coda-sft``: CoDA's planner + executor, SFT only on CoDA's demonstrations for the whole budget;
- ``coda``: CoDA's planner + executor, the same warm start (CoDA demonstrations), then GRPO + RED with the
  recipe's reward (per role: ``agents/rewards/peco.py``, executors with their own baseline);
- ``coda-shared``: ``coda`` with CoDA's shared reward and the planner's advantage inherited by its executors
  (``CODA_ROLLOUT_CODA__REWARD_MODE=shared``, ``CODA_TRAINER_ROLE_BASELINE=inherit``): the ablation;
- ``thinker-searcher``: a Thinker (``configs/smol-thinker-<name>.toml``) trained like ``flat`` (flat
  demonstrations, warm start, GRPO + RED) whose ``<search>`` goes to the searcher service: a frozen search
  agent that searches the same retriever and answers the query. Which model it is: ``--searcher``; by default
  the final LoRA adapter of the ``coda-sft`` run of the same dataset and seed (trained on CoDA's planner +
  executor demonstrations, i.e. a trained executor), loaded into the same inference server under the name
  ``searcher`` beside the policy's adapters, never updated. Its training is not in the Thinker's budget (as
  upstream's searcher is a model trained elsewhere); ``--searcher base``: the untrained model (served as
  ``policy``). The searcher's own prompt (``agents.prompts.searcher_messages``) is not the executor's.
Every trained method gets demonstrations of the same questions (every kept training question's, in its
agent's format) and the same ``--train-s`` seconds of training wall time, warm start included, measured from
the trainer's start to its exit (its checkpoint included); the evals are outside it. Each trained method runs
once per ``--seeds`` seed.

For each run the bench keeps every question's EM, F1, searches, generated tokens and type (CoDA arms: also how
the planner split it, scored against the question's hop plan: ``_qa_delegations.delegations``), and the training
runs' seconds per step and peak RSS per service; ``bench/results/qa.md`` (tables with 95% bootstrap
intervals, overall and by question type, paired differences between arms) and ``qa.json.xz`` (the raw numbers)
are rewritten after every run, so an interrupted bench leaves what it measured. A run already in ``qa.json.xz``
is not run again (``--again``, ``--fresh``). One timed job at a time: two on 2 cores measure neither.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import psutil  # noqa: E402

from agents import get_agent  # noqa: E402
from bench import _results as results  # noqa: E402
from bench._peer_trl_parts import tree_rss  # noqa: E402
from bench._qa_arms import ARMS, DATASETS, RECIPES, SEARCHER_ADAPTER, TRAINED  # noqa: E402
from bench._qa_curve import Snapshots, evaluate_curve, save_curves  # noqa: E402
from bench._qa_delegations import delegations, expected_results  # noqa: E402
from bench._qa_report import write_report  # noqa: E402
from bench._qa_runs import environment, few_shot_prompt, say, step_stats  # noqa: E402
from bench._qa_settings import SETTINGS, arguments, check_env, coda_reward, commit, matmul_precision  # noqa: E402,F401
from launcher import Layout, LocalStack, StackSettings, Supervisor, read_eval, threads_for  # noqa: E402
from services.rollout.config import RolloutSettings  # noqa: E402,F401  re-exported beside check_env, which loads the arms' recipes with it
from shared.settings import read_recipe  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MANY_STEPS = "100000"  # trained methods stop on wall time, not on a step count
# Each stack job (make-sft, the eval) may run this long. The recipes' 1800 s is for make train; a CoDA eval of
# 150 held-out questions (a planner turn per hop, an executor per sub-question) took longer than that here.
JOB_TIMEOUT_S = 4 * 3600.0


def recipe_of(dataset: str, method: str) -> str:
    return str(ROOT / "configs" / f"{RECIPES[ARMS[method].recipe].format(dataset)}.toml")


def searcher_adapter(root: Path, dataset: str, source: str, seed: int) -> Path:
    """The final LoRA adapter (the highest ``policy-vN`` its trainer published) of arm ``source``'s run of this
    dataset and seed under ``root``: thinker-searcher's frozen searcher."""
    weights = root / dataset / f"{source}-seed{seed}" / "weights"
    found = [
        (int(m.group(1)), folder)
        for folder in (weights.iterdir() if weights.is_dir() else [])
        if (m := re.fullmatch(r"policy-v(\d+)", folder.name)) and (folder / "adapter_config.json").is_file()
    ]
    if not found:
        raise RuntimeError(
            f"thinker-searcher: its searcher is the {source} arm's adapter of seed {seed}, but {weights} holds none "
            f"(no such run here): run `bench/qa.py --datasets {dataset} --methods {source} --seeds {seed}` first "
            "(same --root), or choose `--searcher base`"
        )
    return max(found)[1]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.a = args
        self.root = Path(args.root).resolve()
        self.doc = (results.read(args.name, RESULTS) or {}) if not args.fresh else {}
        self.doc.setdefault("runs", {})
        self.plans: dict[str, dict] = {}  # dataset -> expected_results (read once)
        self.doc["config"] = {
            "train_s": args.train_s,
            "warm_steps": args.warm_steps,
            "limit": args.limit,
            "seeds": args.seeds,
            "searcher": args.searcher,
            "machine": f"{os.cpu_count()} CPU cores, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        }

    # ---------------------------------------------------------------- pieces
    def stack(self, dataset: str, method: str, run: Path) -> LocalStack:
        recipe = recipe_of(dataset, method)
        settings = StackSettings.load(recipe)
        settings = settings.model_copy(update={"train_timeout_s": max(settings.train_timeout_s, JOB_TIMEOUT_S)})
        env = ARMS[method].env
        agent = env.get("CODA_ROLLOUT_AGENT") or read_recipe(recipe)["rollout"]["agent"]
        demos = get_agent(agent).demonstrations
        layout = Layout.for_run(run, settings, demos.name if demos else "search")
        layout = dataclasses.replace(layout, evals=run / "eval")  # model, index, demonstrations: cached, shared
        run.mkdir(parents=True, exist_ok=True)
        with environment(env):  # the stack reads the agent (and its demonstrations) as its services will
            return LocalStack(recipe, settings, run=run, layout=layout, say=say)

    def start_servers(self, stack: LocalStack, sup: Supervisor, searcher: Path | None) -> None:
        """The recipe's servers; with ``searcher`` (an adapter in the run's folder) the searcher service serves
        it: loaded into the inference server under ``SEARCHER_ADAPTER`` before the searcher starts."""
        if searcher is None:
            stack.start_servers(sup)
            return
        stack.start_servers(sup, searcher=False)
        stack.load_adapter(SEARCHER_ADAPTER, searcher)
        sup.start(stack.searcher_service(CODA_SEARCHER_SERVED_MODEL_NAME=SEARCHER_ADAPTER))
        say(f"searcher healthy: {searcher.name} served as {SEARCHER_ADAPTER!r}")

    def searcher_for(self, run: Path, dataset: str, method: str, seed: int) -> tuple[Path | None, str | None]:
        """thinker-searcher's frozen searcher (``--searcher``): a copy, in the run's folder (the inference server
        loads adapters from under it), of another arm's final adapter, and what to record of it; (None, what)
        for the base model; (None, None) for the other arms."""
        if method != "thinker-searcher":
            return None, None
        if self.a.searcher == "base":
            return None, "the untrained base model (served as the policy's base, `policy`)"
        source = searcher_adapter(self.root, dataset, self.a.searcher, seed)  # fails before anything starts
        copy = run / "searcher-adapter"
        shutil.copytree(source, copy)
        rel = source.relative_to(self.root) if source.is_relative_to(self.root) else source
        return copy, f"the final adapter of the {self.a.searcher} run of seed {seed} (`{rel}`), frozen"

    def evaluate(
        self, stack: LocalStack, sup: Supervisor, dataset: str, policy: str, searcher: Path | None = None, **env: str
    ) -> dict:
        """The greedy held-out eval, alone on the machine: the inference server is restarted with every core
        (during training it has one, beside the trainer), and the last published adapter loaded into it (and
        the searcher's, ``searcher``). Each CoDA row is scored against its question's hop plan (``delegations``;
        the held-out annotations are read here, to measure, and nowhere in training)."""
        stack.restart_inference(sup, threads=os.cpu_count() or 1)  # the server's own default is 1
        if policy == "live":
            stack.load_last_adapter()
        if searcher is not None:
            stack.load_adapter(SEARCHER_ADAPTER, searcher)
        if dataset not in self.plans:
            self.plans[dataset] = expected_results(dataset)
        plans = self.plans[dataset]
        out = stack.layout.evals / "final"
        args = ["services.rollout", "eval", "--dataset", DATASETS[dataset], "--split", "eval"]
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
                    **delegations(r, plans.get(r["prompt_id"])),
                }
                for r in rows
            ],
            "example": next((r for r in rows if r["f1"] == 1.0 and r.get("type") == "bridge"), None),
        }

    def train_for(
        self,
        stack: LocalStack,
        sup: Supervisor,
        seconds: float,
        rl: bool,
        peaks: dict,
        snaps: Snapshots | None = None,
        before_s: float = 0.0,
        **env: str,
    ) -> float:
        """Trainer (+ rollout when ``rl``) until ``seconds`` have passed or the trainer exits (``max_steps``);
        returns the seconds they ran. ``peaks`` collects each service's peak RSS (MB, with its children);
        ``snaps`` keeps the arm's adapter as it goes (``before_s``: the arm's training seconds before this
        phase)."""
        if not rl:  # demonstrations only: the trainer is alone, as make train's warm start (every core)
            env.setdefault("OMP_NUM_THREADS", str(threads_for("trainer", alone=True)))
        started = time.time()
        trainer = sup.start(stack.trainer_service(**env))
        rollout = sup.start(stack.rollout_service(**env)) if rl else None
        while trainer.proc.poll() is None and time.time() - started < seconds:
            for other in sup.services:
                if other is not trainer and other.proc.poll() is not None:
                    raise RuntimeError(f"{other.name} exited with {other.proc.returncode}:\n{other.tail()}")
                peaks[other.name] = max(peaks.get(other.name, 0.0), tree_rss(other.proc.pid) / 2**20)
            peaks["trainer"] = max(peaks.get("trainer", 0.0), tree_rss(trainer.proc.pid) / 2**20)
            if snaps is not None:
                snaps.poll(before_s + time.time() - started, "rl" if rl else "sft")
            time.sleep(0.5)
        if rollout is not None:
            sup.stop(rollout)
        sup.stop(trainer)
        if trainer.proc.returncode not in (0, None) and trainer.proc.returncode > 0:
            raise RuntimeError(f"trainer exited with {trainer.proc.returncode}:\n{trainer.tail()}")
        return time.time() - started

    # ---------------------------------------------------------------- methods
    def untrained(self, dataset: str, method: str) -> dict:
        env = dict(ARMS[method].env)
        if ARMS[method].shots:
            env["CODA_ROLLOUT_SYSTEM_PROMPT"] = few_shot_prompt(dataset, ARMS[method].shots)
        check_env(recipe_of(dataset, method), env)
        run = self.root / dataset / method
        shutil.rmtree(run, ignore_errors=True)
        stack = self.stack(dataset, method, run)
        with Supervisor(run / "logs") as sup:
            stack.prepare(sup)
            stack.start_servers(sup)
            return {"train_s": 0.0, **self.evaluate(stack, sup, dataset, "base", **env)}

    def trained(self, dataset: str, method: str, seed: int) -> dict:
        arm = ARMS[method]
        check_env(recipe_of(dataset, method), arm.env)
        run = self.root / dataset / f"{method}-seed{seed}"
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir(parents=True)
        searcher, searcher_is = self.searcher_for(run, dataset, method, seed)
        stack = self.stack(dataset, method, run)
        peaks: dict[str, float] = {}
        snaps = Snapshots(run / "weights", run / "curve", self.a.snapshot_every_s)
        with Supervisor(run / "logs") as sup:
            stack.prepare(sup)
            self.start_servers(stack, sup, searcher)
            sft = stack.make_sft(sup)
            env = {
                "CODA_TRAINER_SFT_DATA": str(sft),
                "CODA_TRAINER_CHECKPOINT_EVERY": MANY_STEPS,  # one checkpoint, when stopped
                "CODA_TRAINER_SEED": str(seed),
                "CODA_ROLLOUT_SEED": str(seed),
                **arm.env,
            }
            sft_only = {"CODA_TRAINER_SFT_ONLY": "true", "CODA_TRAINER_RED__MODE": "fixed"}
            if arm.training == "sft":
                used = self.train_for(
                    stack,
                    sup,
                    self.a.train_s,
                    False,
                    peaks,
                    snaps,
                    **env,
                    **sft_only,
                    CODA_TRAINER_MAX_STEPS=MANY_STEPS,
                )
                warm_s = 0.0
            else:
                # The recipe's warm start unless --warm-steps says: CoDA's is longer, so that its planner sees
                # 40 split demonstrations before RL (the trainer's start-up log counts them).
                warm_steps = self.a.warm_steps or stack.settings.warm_start_steps
                warm_s = self.train_for(
                    stack,
                    sup,
                    self.a.train_s,
                    False,
                    peaks,
                    snaps,
                    **env,
                    **sft_only,
                    CODA_TRAINER_MAX_STEPS=str(warm_steps),
                )
                snaps.take(warm_s, "warm")  # the warm start's own adapter: the point RL starts from
                used = warm_s + self.train_for(
                    stack,
                    sup,
                    self.a.train_s - warm_s,
                    True,
                    peaks,
                    snaps,
                    warm_s,
                    **env,
                    CODA_TRAINER_MAX_STEPS=MANY_STEPS,
                )
            snaps.take(used, "final")
            rec = {"train_s": round(used, 1), "warm_s": round(warm_s, 1), "peak_rss_mb": peaks}
            rec["snapshots"] = snaps.points
            if arm.training != "sft":
                rec["warm_steps"] = warm_steps
            rec["precision"] = matmul_precision(recipe_of(dataset, method), self.a.set)
            rec.update(step_stats(run / "trainer" / "train.jsonl"))
            if searcher_is:
                rec["searcher"] = searcher_is
            if arm.recipe == "coda" and arm.training == "rl":
                rec["reward"] = coda_reward(recipe_of(dataset, method), arm.env)
            say(f"{dataset} {method} seed {seed}: {rec['steps']} steps in {used:.0f}s")
            rec.update(self.evaluate(stack, sup, dataset, "live", searcher, **arm.env))
        return rec

    # ---------------------------------------------------------------- all
    def run(self) -> None:
        for dataset in self.a.datasets:
            for i, seed in enumerate(self.a.seeds):
                methods = self.a.methods if i % 2 == 0 else list(reversed(self.a.methods))
                if self.a.searcher != "base":  # the Thinker's searcher is another arm's adapter: that arm first
                    methods = sorted(methods, key=lambda m: m == "thinker-searcher")
                for method in methods:
                    if method not in TRAINED and i > 0:
                        continue  # greedy and untrained: one run is the result
                    key = f"{dataset}/{method}" + (f"/{seed}" if method in TRAINED else "")
                    if key in self.doc["runs"] and not self.a.again:
                        say(f"{key}: already measured")
                        self.curve_of(dataset, method, seed)
                        continue
                    say(f"{key}: {'training ' + str(self.a.train_s) + ' s' if method in TRAINED else 'evaluating'}")
                    started = time.time()
                    rec = self.trained(dataset, method, seed) if method in TRAINED else self.untrained(dataset, method)
                    rec["wall_s"] = round(time.time() - started, 1)
                    rec["commit"] = commit() + "".join(f" {pair}" for pair in self.a.set)
                    self.doc["runs"][key] = rec
                    self.save()
                    self.curve_of(dataset, method, seed)

    def curve_of(self, dataset: str, method: str, seed: int) -> None:
        if self.a.curve and method in TRAINED:
            evaluate_curve(self, dataset, method, seed)
            save_curves(self.doc, RESULTS / self.a.curve_name, self.a.name, self.a.curve_limit)

    def save(self) -> None:
        results.write(self.doc, self.a.name, RESULTS)
        write_report(self.doc, RESULTS / f"{self.a.name}.md")


def main() -> None:
    p = arguments(__doc__.splitlines()[0])
    args = p.parse_args()
    if args.report_only:
        doc = results.read(args.name, RESULTS)
        if doc is None:
            p.error(f"no raw results {args.name}.json.xz in {RESULTS}")
        write_report(doc, RESULTS / f"{args.name}.md")
        return
    for pair in args.set:
        name, sep, value = pair.partition("=")
        if not sep or not name.startswith("CODA_"):
            p.error(f"--set {pair!r}: expected CODA_<SERVICE>_<FIELD>=VALUE")
        os.environ[name] = value  # the services inherit the bench's environment (Supervisor)
    Bench(args).run()


if __name__ == "__main__":
    main()
