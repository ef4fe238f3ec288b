"""The statistics of the multi-hop QA bench's report (``bench._qa_report``) and of the targets it checks
(``bench._qa_kinds``): percentile-bootstrap intervals over questions, paired differences between arms, one number
per question over the seeds, and the runs a table compares (every method on the same questions).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from bench._qa_arms import METHODS


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


def paired_ci(
    a: dict[str, float], b: dict[str, float], ids=None, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """The mean difference a − b over the questions both arms have (or ``ids``) and its paired 95% bootstrap
    interval: every resample draws question indices once and takes both arms' scores at them, which is
    ``bootstrap_ci`` over the per-question differences (a question's score: its F1 averaged over the seeds)."""
    ids = sorted(set(a) & set(b)) if ids is None else sorted(ids)
    return bootstrap_ci([a[q] - b[q] for q in ids], n_boot=n_boot, seed=seed)


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
    return "–" if m[0] != m[0] else f"{m[0]:.3f} [{m[1]:.3f}, {m[2]:.3f}]"  # NaN: no question of that kind


def _num(x, fmt: str = "{:.1f}") -> str:
    return "–" if x is None else fmt.format(x)


def _common(doc: dict, dataset: str) -> list[dict]:
    """The runs of the first measured method: every method is restricted to the same questions (``_runs``), so
    their rows name the questions the whole table is over."""
    return next((runs for m in METHODS if (runs := _runs(doc, dataset, m))), [])
