"""The multi-hop QA bench's report: ``bench/results/qa.md`` from ``qa.json`` (written by ``bench/qa.py``).

Per dataset one table (methods as rows; EM and F1 with 95% bootstrap intervals over questions, searches and
generated tokens per question, training wall time, speed and memory), the same F1 by question type, and the
targets of the benchmark checked against the numbers.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

# name -> (dataset, flat recipe, CoDA recipe)
DATASETS = {
    "hotpotqa": ("bundled:hotpotqa-dev", "smol-hotpotqa", "smol-coda-hotpotqa"),
    "2wiki": ("bundled:2wiki-dev", "smol-2wiki", "smol-coda-2wiki"),
}
TITLES = {"hotpotqa": "HotpotQA (distractor dev, hard)", "2wiki": "2WikiMultihopQA (dev)"}
METHODS = {
    "zero-shot": "(a) zero-shot, search protocol",
    "naive-rag": "(b) naive RAG, top-3, one turn",
    "sft": "(c) SFT only",
    "flat": "(d) flat Search-R1, GRPO + RED",
    "coda": "(e) CoDA planner + executor, GRPO + RED",
}
TRAINED = ("sft", "flat", "coda")
RL = ("flat", "coda")
TARGET_F1 = {"hotpotqa": 0.35, "2wiki": 0.40}
MARGIN = 0.10
RESTATES = 0.8  # a CoDA task with this token F1 against the question delegates it whole


def bootstrap_ci(values, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``values`` and its percentile-bootstrap interval (resampling the values with replacement)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(x.mean()), float(lo), float(hi)


def per_question(runs: list[dict], key: str) -> dict[str, float]:
    """One number per question: ``key`` averaged over the runs (seeds) that evaluated it."""
    sums: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        for row in run["rows"]:
            sums[row["id"]].append(float(row[key] or 0.0))
    return {qid: sum(v) / len(v) for qid, v in sums.items()}


def _runs(doc: dict, dataset: str, method: str) -> list[dict]:
    """The runs of one method on one dataset, every one restricted to the questions that every run of every
    method of that dataset evaluated (a method evaluated on more questions earlier is compared on the same
    ones as the rest)."""

    def of(m: str) -> list[dict]:
        prefix = f"{dataset}/{m}"
        return [r for key, r in sorted(doc["runs"].items()) if key == prefix or key.startswith(prefix + "/")]

    every = [run for m in METHODS for run in of(m)]
    common = set.intersection(*({row["id"] for row in run["rows"]} for run in every)) if every else set()
    return [{**run, "rows": [row for row in run["rows"] if row["id"] in common]} for run in of(method)]


def _ci(runs: list[dict], key: str) -> tuple[float, float, float]:
    return bootstrap_ci(list(per_question(runs, key).values()))


def _fmt_ci(m: tuple[float, float, float]) -> str:
    return f"{m[0]:.3f} [{m[1]:.3f}, {m[2]:.3f}]"


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _num(x, fmt: str = "{:.1f}") -> str:
    return "–" if x is None else fmt.format(x)


def _peaks(runs: list[dict]) -> str:
    peaks: dict[str, float] = {}
    for run in runs:
        for name, mb in (run.get("peak_rss_mb") or {}).items():
            peaks[name] = max(peaks.get(name, 0.0), mb)
    order = ["trainer", "inference", "rollout", "retriever", "redis"]
    names = sorted(peaks, key=lambda n: order.index(n) if n in order else len(order))
    return ", ".join(f"{n} {peaks[n]:,.0f}" for n in names) or "–"


def method_row(doc: dict, dataset: str, method: str) -> str | None:
    runs = _runs(doc, dataset, method)
    if not runs:
        return None
    per_seed = " / ".join(f"{_mean([row['f1'] for row in r['rows']]):.3f}" for r in runs) if len(runs) > 1 else ""
    rows = [row for r in runs for row in r["rows"]]
    trained = method in TRAINED
    return (
        f"| {METHODS[method]} | {len(runs)} | {len(runs[0]['rows'])} | {_fmt_ci(_ci(runs, 'em'))} | "
        f"{_fmt_ci(_ci(runs, 'f1'))} | {per_seed or '–'} | "
        f"{_mean([row['searches'] for row in rows]):.2f} | {_mean([row['tokens'] for row in rows]):.0f} | "
        f"{_num(_mean([r['train_s'] for r in runs]), '{:.0f} s') if trained else '–'} | "
        f"{_num(_mean([r.get('steps') for r in runs]), '{:.0f}') if trained else '–'} | "
        f"{' / '.join(_num(sft_step_s(r)) + _precision(r) for r in runs) if trained else '–'} | "
        f"{_num(_mean([r.get('s_per_rl_step') for r in runs]))} | {_rewards(runs)} | "
        f"{_peaks(runs) if trained else '–'} | {', '.join(sorted({r.get('commit') or '?' for r in runs}))} |"
    )


def sft_step_s(run: dict) -> float | None:
    """Wall seconds per demonstrations-only step (SFT only: the whole run; RL arms: the warm start), trainer
    start-up included: the same work in every run, so it tells how fast the machine was that day."""
    sft_steps = (run.get("steps") or 0) - (run.get("rl_steps") or 0)
    seconds = run.get("warm_s") if run.get("rl_steps") else run.get("train_s")
    return seconds / sft_steps if seconds and sft_steps > 0 else None


def _precision(run: dict) -> str:
    """`` (bf16)`` / `` (fp32)``: what the run's trainer computed in; nothing for runs recorded before the bench
    noted it."""
    return f" ({run['precision']})" if run.get("precision") else ""


def _rewards(runs: list[dict]) -> str:
    """The RL steps' mean training reward, first five against last five (the signal GRPO had to learn from)."""
    first, last = _mean([r.get("reward_first") for r in runs]), _mean([r.get("reward_last") for r in runs])
    return "–" if first is None or last is None else f"{first:.3f} → {last:.3f}"


def _current_types(dataset: str) -> dict[str, str]:
    """Each question's type as ``recipes.datasets.question_type`` gives it now: a run recorded before a type
    could be told (2Wiki's unlabelled questions, once ``unknown``) is tabled like a run made today. Empty when
    the project is not importable (the report alone)."""
    try:
        from recipes.datasets import load_prompts, question_type
    except ImportError:
        return {}
    return {r.prompt_id: question_type(r) for r in load_prompts(DATASETS[dataset][0])}


def type_table(doc: dict, dataset: str) -> list[str]:
    measured = [runs for m in METHODS if (runs := _runs(doc, dataset, m))]
    if not measured:
        return []
    types: dict[str, set[str]] = defaultdict(set)  # type -> question ids (the same for every method)
    today = _current_types(dataset)
    for row in measured[0][0]["rows"]:
        types[today.get(row["id"], row["type"])].add(row["id"])
    names = sorted(types, key=lambda t: (-len(types[t]), t))
    out = [
        "| method | " + " | ".join(f"{t} (n={len(types[t])})" for t in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for method in METHODS:
        runs = _runs(doc, dataset, method)
        if not runs:
            continue
        f1 = per_question(runs, "f1")
        cells = [_fmt_ci(bootstrap_ci([f1[qid] for qid in sorted(types[t])])) for t in names]
        out.append(f"| {METHODS[method]} | " + " | ".join(cells) + " |")
    return out


def delegations(row: dict) -> dict:
    """What ``qa.json`` keeps of a CoDA episode's split of its question (``{}`` for other agents, from an eval
    row's ``facts``): the tasks the planner delegated, how many restate the question (no decomposition), the
    best F1 an executor's answer had against the gold answers, and whether the final answer is an executor's."""
    from recipes.answers import normalize_answer, token_f1  # the project's scoring; the report alone needs none

    facts = row.get("facts") or {}
    if "tasks" not in facts:
        return {}
    tasks, answers = facts["tasks"], [a for a in facts["executor_answers"] if a]
    final = normalize_answer(row.get("prediction") or "")
    return {
        "tasks": len(tasks),
        "restated": sum(token_f1(task, row["question"]) >= RESTATES for task in tasks),
        "executor_f1": max((token_f1(a, row["golden_answers"]) for a in answers), default=0.0),
        "passed_on": bool(final) and any(normalize_answer(a) == final for a in answers),
    }


def delegation_table(doc: dict, dataset: str) -> list[str]:
    """CoDA's runs: how the planner split the questions (rows recorded with ``tasks``; older runs have none)."""
    runs = [(key, r) for key, r in sorted(doc["runs"].items()) if key.startswith(f"{dataset}/coda/")]
    runs = [(key, r) for key, r in runs if r["rows"] and all("tasks" in row for row in r["rows"])]
    if not runs:
        return []
    out = [
        "CoDA's delegations (greedy, held out): tasks the planner delegated per question; questions it split into "
        f"two or more; tasks that restate the question (token F1 ≥ {RESTATES} with it); the best F1 of an executor's "
        "answer against the gold answers; final answers that repeat an executor's; the final answer's F1.",
        "",
        "| run | questions | tasks / q | split (≥ 2 tasks) | tasks restating the question | executor's best F1 | "
        "final = an executor's answer | final F1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, run in runs:
        rows = run["rows"]
        tasks = sum(row["tasks"] for row in rows)
        out.append(
            f"| {key} | {len(rows)} | {tasks / len(rows):.2f} | {_share(row['tasks'] >= 2 for row in rows)} | "
            f"{sum(row['restated'] for row in rows) / max(tasks, 1):.0%} | "
            f"{_mean([row['executor_f1'] for row in rows]):.3f} | {_share(row['passed_on'] for row in rows)} | "
            f"{_mean([row['f1'] for row in rows]):.3f} |"
        )
    return ["", *out]


def _share(flags) -> str:
    flags = list(flags)
    return f"{sum(flags) / len(flags):.0%}" if flags else "–"


def targets(doc: dict, dataset: str) -> list[str]:
    """The benchmark's bar: the best RL method above the best untrained one and SFT only by >= MARGIN F1 with
    disjoint intervals, and held-out F1 >= TARGET_F1."""
    f1 = {m: _ci(_runs(doc, dataset, m), "f1") for m in METHODS if _runs(doc, dataset, m)}
    rl = [m for m in RL if m in f1]
    if not rl:
        return ["- no GRPO method measured yet"]
    best = max(rl, key=lambda m: f1[m][0])
    lines = []
    for rivals, what in ((["zero-shot", "naive-rag"], "the best untrained method"), (["sft"], "SFT only")):
        have = [m for m in rivals if m in f1]
        if not have:
            lines.append(f"- against {what}: not measured")
            continue
        rival = max(have, key=lambda m: f1[m][0])
        gap = f1[best][0] - f1[rival][0]
        disjoint = f1[best][1] > f1[rival][2]
        ok = gap >= MARGIN and disjoint
        lines.append(
            f"- {METHODS[best]} − {METHODS[rival]} ({what}): F1 {gap:+.3f}, intervals "
            f"{'disjoint' if disjoint else 'overlap'} → {'met' if ok else 'not met'} (bar: ≥ +{MARGIN:.2f}, disjoint)"
        )
    reached = f1[best][0] >= TARGET_F1[dataset]
    lines.append(
        f"- held-out F1 of {METHODS[best]}: {f1[best][0]:.3f} → {'met' if reached else 'not met'} "
        f"(bar: ≥ {TARGET_F1[dataset]:.2f})"
    )
    return lines


def _seeds(doc: dict) -> list[str]:
    """The seeds the trained runs used (keys ``dataset/method/seed``), over every ``bench/qa.py`` call."""
    return sorted({key.split("/")[2] for key in doc["runs"] if key.count("/") == 2}, key=int)


def write_report(doc: dict, md: Path) -> None:
    cfg = doc["config"]
    lines = [
        "# Real multi-hop QA: HotpotQA and 2WikiMultihopQA, held-out dev questions",
        "",
        f"Written by `bench/qa.py` (raw numbers: `{md.stem}.json`); reproduce with `.venv/bin/python bench/qa.py`. "
        f"Machine: {cfg.get('machine', '?')}, no GPU. Model: SmolLM2-135M-Instruct (LoRA r16 for the trained "
        "methods). Questions: each dataset's fixed held-out split (`recipes/datasets.py`, never trained on, never "
        f"a demonstration), {'the first ' + str(cfg['limit']) if cfg.get('limit') else 'all'} of them; greedy "
        f"decoding. Seeds: {', '.join(_seeds(doc)) or '–'} (the runs of a trained method are its seeds); a method "
        "missing below was not run (`--methods`). "
        "Trained methods: the same demonstrations (make-sft over the train split) and "
        f"{cfg['train_s']:.0f} s of training wall time each (the RL methods' {cfg['warm_steps']}-step SFT warm "
        "start inside it), one run per seed; their intervals pool the seeds (each question's score averaged over "
        "the runs). Intervals: 95% percentile bootstrap over questions (2,000 resamples). Train reward: the mean "
        "reward of the RL steps' sampled episodes (not greedy, not held out). s / SFT step: wall seconds a "
        "demonstrations-only step took, per run (the SFT run, or the RL run's warm start): the same work in every "
        "run, so it shows the machine's speed that day (it varied by 2.5x between days; compare runs of similar "
        "speed); in brackets the precision the trainer computed in (precision auto: bf16 autocast on a CPU that "
        "multiplies bf16 natively, else fp32; no bracket: recorded before the bench noted it). "
        "Commit: what each row's runs ran "
        "(`+configs`: with the recipes then uncommitted; `?`: recorded before commits were).",
        "",
    ]
    for dataset in DATASETS:
        if not any(_runs(doc, dataset, m) for m in METHODS):
            continue
        lines += [
            f"## {TITLES[dataset]}",
            "",
            "| method | runs | questions | EM [95% CI] | F1 [95% CI] | F1 per run | searches / q | generated "
            "tokens / q | training wall time | steps | s / SFT step | s / RL step | train reward, RL steps 1-5 → "
            "last 5 | peak RSS per service (MB) | commit |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [row for m in METHODS if (row := method_row(doc, dataset, m))]
        lines += ["", "F1 by question type [95% CI]:", "", *type_table(doc, dataset), *delegation_table(doc, dataset)]
        lines += ["", "Targets:", ""]
        lines += targets(doc, dataset)
        lines.append("")
    md.write_text("\n".join(lines))
