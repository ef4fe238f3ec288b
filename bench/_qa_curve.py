"""Learning curves of the multi-hop QA bench: adapters kept while an arm trains, and their F1 afterwards.

While a trained arm runs, ``Snapshots`` copies the newest adapter its trainer published (``weights/policy-vN``)
into ``curve/`` every ``every_s`` seconds of training wall time, and once more when a phase ends (the warm
start's last adapter is the point RL must not fall below). ``python -m bench.qa --curve`` then evaluates each
kept adapter, outside the training budget, on a fixed subset of open-answer held-out questions (the first N in
file order whose gold answer is not yes/no and not named in the question: ``agents.question_kinds``), and
``write_curves`` draws F1 against training minutes per arm and seed, with the raw numbers beside the plot.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench._qa_arms import ARMS, DATASETS, SEARCHER_ADAPTER
from bench._qa_runs import say
from launcher import Supervisor, read_eval

if TYPE_CHECKING:
    from bench.qa import Bench

_VERSION = re.compile(r"policy-v(\d+)")


def newest_adapter(weights: Path) -> tuple[int, Path] | None:
    """The highest published LoRA adapter under ``weights`` (a complete folder: it holds its config)."""
    found = [
        (int(m.group(1)), folder)
        for folder in (weights.iterdir() if weights.is_dir() else [])
        if (m := _VERSION.fullmatch(folder.name)) and (folder / "adapter_config.json").is_file()
    ]
    return max(found) if found else None


class Snapshots:
    """Copies of an arm's adapter at training times; ``points`` is what the run's record keeps of them."""

    def __init__(self, weights: Path, into: Path, every_s: float) -> None:
        self.weights, self.into, self.every_s = weights, into, every_s
        self.points: list[dict] = []
        self.next_s = every_s

    def poll(self, train_s: float, phase: str) -> None:
        """Called while training, ``train_s`` seconds into the arm's budget: keep a copy when one is due."""
        if self.every_s > 0 and train_s >= self.next_s and self.take(train_s, phase):
            self.next_s = (train_s // self.every_s + 1) * self.every_s

    def take(self, train_s: float, phase: str) -> bool:
        """Copy the newest adapter now (unless it is the one kept last); False when none is published yet or
        it was deleted while being copied (the trainer keeps only its last few: the next poll tries again)."""
        newest = newest_adapter(self.weights)
        if newest is None:
            return False
        version, folder = newest
        if self.points and self.points[-1]["version"] == version:
            return True  # the weights of the last point (e.g. the warm start's, before RL's first publish)
        target = self.into / f"t{int(train_s):05d}-v{version}"
        try:
            shutil.copytree(folder, target)
        except (FileNotFoundError, shutil.Error):
            shutil.rmtree(target, ignore_errors=True)
            return False
        self.points.append({"train_s": round(train_s, 1), "version": version, "phase": phase, "path": target.name})
        return True


def open_subset_note(n: int) -> str:
    return f"the first {n} open-answer held-out questions (gold not yes/no, not named in the question), greedy"


def curve_points(doc: dict) -> dict[str, list[dict]]:
    """Every run of ``doc`` that has evaluated snapshots: run key -> its points (train_s, phase, f1, em, n)."""
    out = {}
    for key, run in sorted(doc.get("runs", {}).items()):
        points = [p for p in run.get("snapshots", []) if "f1" in p]
        if points:
            out[key] = [{k: p[k] for k in ("train_s", "version", "phase", "f1", "em", "n", "eval_s")} for p in points]
    return out


def write_curves(curves: dict[str, list[dict]], png: Path, raw: Path, note: str) -> None:
    """The raw points (``raw``, JSON: run key -> points) and the plot: open-answer F1 against training minutes,
    one line per run (arm / seed), a hollow marker at the end of the warm start."""
    raw.write_text(json.dumps({"questions": note, "runs": curves}, indent=1) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (key, points) in enumerate(sorted(curves.items())):
        xs = [p["train_s"] / 60 for p in points]
        ys = [p["f1"] for p in points]
        ax.plot(xs, ys, marker="o", color=f"C{i % 10}", label=key)
        for p in points:
            if p["phase"] == "warm":
                ax.plot(p["train_s"] / 60, p["f1"], marker="o", markersize=11, mfc="none", color=f"C{i % 10}")
    ax.set_xlabel("training wall time (min, 2 CPU cores; hollow ring: end of the SFT warm start)")
    ax.set_ylabel("open-answer F1")
    ax.set_title(note, fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def evaluate_curve(bench: Bench, dataset: str, method: str, seed: int) -> None:
    """Evaluate the run's kept adapters that have no score yet (``--curve``), each alone on the machine in
    a fresh inference server, on the first ``--curve-limit`` open-answer held-out questions; the doc is
    saved after every point, so an interrupted curve keeps what it measured."""
    rec = bench.doc["runs"].get(f"{dataset}/{method}/{seed}")
    todo = [p for p in (rec or {}).get("snapshots", []) if "f1" not in p]
    if not todo:
        return
    run = bench.root / dataset / f"{method}-seed{seed}"
    searcher = run / "searcher-adapter" if method == "thinker-searcher" else None
    stack = bench.stack(dataset, method, run)
    with Supervisor(run / "logs-curve") as sup:
        stack.prepare(sup)
        bench.start_servers(stack, sup, searcher)
        for point in todo:
            name = f"curve-{point['path']}"
            stack.restart_inference(sup, threads=os.cpu_count() or 1)
            stack.load_adapter(name, run / "curve" / point["path"])
            if searcher is not None:
                stack.load_adapter(SEARCHER_ADAPTER, searcher)
            out = stack.layout.evals / name
            args = ["services.rollout", "eval", "--dataset", DATASETS[dataset], "--split", "eval"]
            args += ["--eval-output", str(out), "--eval-policy", "base", "--eval-kind", "open"]
            args += ["--eval-limit", str(bench.a.curve_limit)]
            started = time.time()
            stack.job(sup, "eval", args, **ARMS[method].env, CODA_ROLLOUT_SERVED_MODEL_NAME=name)
            result = read_eval(out)
            rows = json.loads(result.path.read_text())["rows"]
            point.update(
                f1=round(sum(r["f1"] for r in rows) / len(rows), 4),
                em=round(sum(r["em"] for r in rows) / len(rows), 4),
                n=len(rows),
                eval_s=round(time.time() - started, 1),
                rows=[{"id": r["prompt_id"], "f1": r["f1"]} for r in rows],
            )
            say(f"{dataset}/{method}/{seed} at {point['train_s'] / 60:.1f} min: open F1 {point['f1']:.3f}")
            bench.save()


def save_curves(doc: dict, stem: Path, name: str, curve_limit: int) -> None:
    """Write the curves of ``doc`` (bench run ``name``) beside those already at ``stem`` (``.png``, ``.json``)."""
    raw = stem.with_suffix(".json")
    merged = json.loads(raw.read_text())["runs"] if raw.is_file() else {}
    merged.update({f"{name}:{k}": v for k, v in curve_points(doc).items()})
    write_curves(merged, stem.with_suffix(".png"), raw, open_subset_note(curve_limit))
