"""The multi-hop QA bench's report: ``bench/results/qa.md`` from ``qa.json.xz`` (written by ``python -m bench.qa``).

Per dataset one table (methods as rows; F1 on the open questions, then on the choice questions against the
reading-free baseline, then overall F1 and EM, all with 95% bootstrap intervals over questions; searches and
generated tokens per question, training wall time, speed and memory), F1 by question type (each type marked open or
choice), paired differences between arms (``PAIRS``, on the open questions first), how the CoDA arms split their
questions (per run, and per question type against each question's hop plan), and the targets of the benchmark
checked against the numbers.

The arms are ``bench._qa_arms``; open and choice questions and the baseline, ``bench._qa_kinds``; what a CoDA
episode made of its question, ``bench._qa_delegations``.
"""

from __future__ import annotations

from collections import defaultdict
from functools import cache
from pathlib import Path

from agents.rewards.peco import RESTATES  # a CoDA task that asks the whole question
from bench._qa_arms import CODA_LIKE, DATASETS, METHODS, RL, TITLES, TRAINED
from bench._qa_delegations import HOP1_RIGHT, _share, hierarchy_stats
from bench._qa_delegations import mean as _mean
from bench._qa_kinds import (
    CHOICE,
    OPEN,
    baseline_row,
    below_baseline,
    choice_baseline,
    counts,
    kind_ci,
    kinds,
    of_kind,
    targets,
    type_kind,
)
from bench._qa_stats import _ci, _common, _fmt_ci, _num, _runs, bootstrap_ci, paired_ci, per_question

# Paired differences the report tables (first − second, on the same questions): open, choice, overall and these
# types. Each RL arm against its own SFT-only arm first: whether RL added anything is the bench's first question.
PAIRS = (
    ("flat", "sft"),
    ("coda", "coda-sft"),
    ("coda", "flat"),
    ("coda-sft", "flat"),
    ("coda", "coda-shared"),
    ("thinker-searcher", "flat"),
)
PAIRED_TYPES = {"hotpotqa": (), "2wiki": ("compositional",)}


def _peaks(runs: list[dict]) -> str:
    peaks: dict[str, float] = {}
    for run in runs:
        for name, mb in (run.get("peak_rss_mb") or {}).items():
            peaks[name] = max(peaks.get(name, 0.0), mb)
    order = ["trainer", "inference", "rollout", "retriever", "redis"]
    names = sorted(peaks, key=lambda n: order.index(n) if n in order else len(order))
    return ", ".join(f"{n} {peaks[n]:,.0f}" for n in names) or "–"


def method_row(doc: dict, dataset: str, method: str, baseline: float | None = None) -> str | None:
    """One arm's row; its choice F1 carries ``↓`` when under ``baseline`` (the reading-free guess's choice F1)."""
    runs = _runs(doc, dataset, method)
    if not runs:
        return None
    kind_of = kinds(dataset, runs)
    per_seed = " / ".join(_num(kind_ci([r], kind_of, OPEN)[0], "{:.3f}") for r in runs) if len(runs) > 1 else ""
    rows = [row for r in runs for row in r["rows"]]
    trained = method in TRAINED
    choice = kind_ci(runs, kind_of, CHOICE)
    below = baseline is not None and choice[0] < baseline
    return (
        f"| {METHODS[method]} | {len(runs)} | {counts((row['id'] for row in runs[0]['rows']), kind_of)} | "
        f"**{_fmt_ci(kind_ci(runs, kind_of, OPEN))}** | {_fmt_ci(choice)}{' ↓' if below else ''} | "
        f"{_fmt_ci(_ci(runs, 'f1'))} | {_fmt_ci(_ci(runs, 'em'))} | {per_seed or '–'} | "
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
    if first is None or last is None:
        return "–"
    signal = _mean([r.get("signal_share") for r in runs])  # recorded since the RL-step round
    return f"{first:.3f} → {last:.3f}" + (f" ({signal:.0%} of groups with signal)" if signal is not None else "")


@cache
def _current_types(dataset: str) -> dict[str, str]:
    """Each question's type as ``agents.datasets.question_type`` gives it now: a run recorded before a type
    could be told (2Wiki's unlabelled questions, once ``unknown``) is tabled like a run made today. Empty when
    the project is not importable (the report alone)."""
    try:
        from agents.datasets import load_prompts, question_type
    except ImportError:
        return {}
    return {r.prompt_id: question_type(r) for r in load_prompts(DATASETS[dataset])}


def type_table(doc: dict, dataset: str) -> list[str]:
    measured = [runs for m in METHODS if (runs := _runs(doc, dataset, m))]
    if not measured:
        return []
    types: dict[str, set[str]] = defaultdict(set)  # type -> question ids (the same for every method)
    today = _current_types(dataset)
    for row in measured[0][0]["rows"]:
        types[today.get(row["id"], row["type"])].add(row["id"])
    names = sorted(types, key=lambda t: (-len(types[t]), t))
    kind_of = kinds(dataset, measured[0])
    out = [
        "| method | " + " | ".join(f"{t} ({type_kind(types[t], kind_of)})" for t in names) + " |",
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


def delegation_table(doc: dict, dataset: str) -> list[str]:
    """The CoDA arms' runs: how the planner split the questions (rows recorded with ``tasks``; older runs have
    none, and an episode that failed, e.g. timed out, has no record of its tasks: it is left out here)."""
    prefixes = tuple(f"{dataset}/{m}/" for m in CODA_LIKE)
    runs = [(key, r) for key, r in sorted(doc["runs"].items()) if key.startswith(prefixes)]
    runs = [(key, [row for row in r["rows"] if "tasks" in row]) for key, r in runs]
    runs = [(key, rows) for key, rows in runs if rows]
    if not runs:
        return []
    out = [
        "CoDA's delegations (greedy, held out): tasks the planner delegated per question; questions it split into "
        f"two or more; tasks that restate the question (token F1 ≥ {RESTATES} with it and every word of it); the best F1 of an executor's "
        "answer against the gold answers; final answers that repeat an executor's; the final answer's F1.",
        "",
        "| run | questions | tasks / q | split (≥ 2 tasks) | tasks restating the question | executor's best F1 | "
        "final = an executor's answer | final F1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, rows in runs:
        tasks = sum(row["tasks"] for row in rows)
        out.append(
            f"| {key} | {len(rows)} | {tasks / len(rows):.2f} | {_share(row['tasks'] >= 2 for row in rows)} | "
            f"{sum(row['restated'] for row in rows) / max(tasks, 1):.0%} | "
            f"{_mean([row['executor_f1'] for row in rows]):.3f} | {_share(row['passed_on'] for row in rows)} | "
            f"{_mean([row['f1'] for row in rows]):.3f} |"
        )
    return ["", *out]


def hierarchy_table(doc: dict, dataset: str) -> list[str]:
    """``hierarchy_stats`` per CoDA arm (its seeds pooled) and question type, over the runs recorded with the
    plan's fields (older runs have none)."""
    today = _current_types(dataset)
    out = []
    for method in CODA_LIKE:
        runs = [r for r in _runs(doc, dataset, method) if any("empty_answers" in x for x in r["rows"])]
        if not runs:
            continue
        rows = [row for run in runs for row in run["rows"] if "empty_answers" in row]  # failed episodes: no record
        by_type: dict[str, list[dict]] = defaultdict(list)
        for row in rows:
            by_type[today.get(row["id"], row["type"])].append(row)
        names = sorted(by_type, key=lambda t: (-len(by_type[t]), t))
        for name, group in [*((t, by_type[t]) for t in names), ("all", rows)]:
            st = hierarchy_stats(group)
            pct = lambda x: _num(x, "{:.0%}")  # noqa: E731
            out.append(
                f"| {METHODS[method]} | {name} | {len({row['id'] for row in group})} × {len(runs)} | "
                f"{_num(st['tasks_per_q'], '{:.2f}')} | {_num(st['plan_tasks'], '{:.2f}')} | {pct(st['split'])} | "
                f"{pct(st['restating'])} | {pct(st['chain'])} | {st['planned']} | {_num(st['hop1_f1'], '{:.3f}')} | "
                f"{_num(st['hop2_f1'], '{:.3f}')} | {_num(st['hop2_f1_hop1_right'], '{:.3f}')} ({st['hop1_right']}) | "
                f"{pct(st['empty'])} | {pct(st['final_last'])} | {_num(st['f1'], '{:.3f}')} |"
            )
    if not out:
        return []
    return [
        "",
        "CoDA's delegations by question type (greedy, held out; seeds pooled): tasks per question; questions split "
        f"into two or more tasks; tasks restating the question (token F1 ≥ {RESTATES} and every word of it); chain: of the split "
        "questions, those whose task 2 contains task 1's executor answer (normalised, not empty); hop-1 / hop-2 F1: "
        "each executor's answer against the sub-question the question's plan (`agents.plans`, from the held-out "
        "annotations, read to measure only) expects at the same delegation index, over the planned questions (a "
        "delegation not made scores 0; hop 1 = the first half of the plan's sub-questions, hop 2 = the second "
        "half: a bridge's two hops, a comparison's two entities, a bridge_comparison's two first hops then two "
        "second hops); hop-2 F1 where hop 1 was right: over the planned questions whose hop-1 F1 is ≥ "
        f"{HOP1_RIGHT} (how many in brackets); executors that answered nothing; final answers that are the last "
        "delegation's answer word for word (normalised); the final answer's F1. plan's tasks / q: the sub-questions "
        "of the planned questions' plans.",
        "",
        "| arm | type | questions × runs | tasks / q | plan's tasks / q | split (≥ 2 tasks) | restating | chain | "
        "planned | hop-1 F1 | hop-2 F1 | hop-2 F1 where hop 1 right (n) | empty executor answers | "
        "final = last executor's answer | final F1 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *out,
    ]


def paired_table(doc: dict, dataset: str) -> list[str]:
    """``PAIRS``: F1 of one arm minus another's on the same questions, with paired 95% intervals, on the open
    questions, the choice ones, overall and for ``PAIRED_TYPES``."""
    f1 = {m: per_question(runs, "f1") for m in METHODS if (runs := _runs(doc, dataset, m))}
    pairs = [(a, b) for a, b in PAIRS if a in f1 and b in f1]
    if not pairs:
        return []
    today = _current_types(dataset)
    kind_of = kinds(dataset, _common(doc, dataset))
    types = PAIRED_TYPES.get(dataset, ())
    out = [
        "",
        "Paired differences (F1 of the first arm minus the second's on the same questions, each question's F1 "
        "averaged over an arm's seeds; 95% paired bootstrap: 2,000 resamples of the questions, the same resample "
        "for both arms, seed 0), on the open questions first:",
        "",
        "| difference | **open** | choice | overall |" + "".join(f" {t} |" for t in types),
        "|---|---|---|---|" + "---|" * len(types),
    ]
    for a, b in pairs:
        ids = sorted(set(f1[a]) & set(f1[b]))
        cells = []
        for kind in (OPEN, CHOICE):
            picked = of_kind(kind_of, ids, kind)
            cells.append(_fmt_diff(paired_ci(f1[a], f1[b], picked), len(picked)))
        cells.append(_fmt_diff(paired_ci(f1[a], f1[b], ids), len(ids)))
        for t in types:
            of_type = [q for q in ids if today.get(q, _row_type(doc, dataset, q)) == t]
            cells.append(_fmt_diff(paired_ci(f1[a], f1[b], of_type), len(of_type)))
        out.append(f"| {a} − {b} | " + " | ".join(cells) + " |")
    return out


def _fmt_diff(m: tuple[float, float, float], n: int) -> str:
    return "–" if n == 0 else f"{m[0]:+.3f} [{m[1]:+.3f}, {m[2]:+.3f}] (n={n})"


def _row_type(doc: dict, dataset: str, qid: str) -> str:
    """A question's type as a run recorded it (when the project cannot say it today)."""
    for key, run in doc["runs"].items():
        if key.startswith(f"{dataset}/"):
            for row in run["rows"]:
                if row["id"] == qid:
                    return row["type"]
    return "unknown"


# What the CoDA runs recorded before the bench noted their reward trained with: CoDA's shared reward (the only
# one the recipes had) and the trainer's default role_baseline.
EARLIER_REWARD = "shared / inherit"


def rewards(doc: dict, dataset: str) -> list[str]:
    """The reward each CoDA RL arm's runs trained with (``bench/qa.py`` records the rollout's ``reward_mode`` and
    the trainer's ``role_baseline``): one arm key, two meanings over time, so the table says which."""
    said = []
    for method in (m for m in CODA_LIKE if m in RL):
        runs = {key: r for key, r in sorted(doc["runs"].items()) if key.startswith(f"{dataset}/{method}/")}
        if runs:
            used = defaultdict(list)
            for key, r in runs.items():
                used[r.get("reward") or f"{EARLIER_REWARD} (recorded before the bench noted it)"].append(
                    key.split("/")[2]
                )
            said.append(f"{method}: " + ", ".join(f"{how} (seeds {', '.join(s)})" for how, s in used.items()))
    return ["", "CoDA rewards (rollout reward_mode / trainer role_baseline): " + "; ".join(said) + "."] if said else []


def searchers(doc: dict, dataset: str) -> list[str]:
    """What the thinker-searcher runs' frozen searcher was (``bench/qa.py`` records it with each run)."""
    used = sorted({r.get("searcher") or "?" for r in _runs(doc, dataset, "thinker-searcher")})
    return ["", f"{METHODS['thinker-searcher']}: the searcher was " + "; ".join(used) + "."] if used else []


def _seeds(doc: dict) -> list[str]:
    """The seeds the trained runs used (keys ``dataset/method/seed``), over every ``bench/qa.py`` call."""
    return sorted({key.split("/")[2] for key in doc["runs"] if key.count("/") == 2}, key=int)


def reproduce_commands(doc: dict, stem: str) -> list[str]:
    """The ``bench.qa`` commands that measure this page's runs again: one per set of ``--set`` settings the runs
    had (recorded after the commit, ``2504d59 CODA_X=1``), each with its datasets, methods and seeds."""
    cfg, groups = doc["config"], defaultdict(list)
    for key, run in doc["runs"].items():
        groups[tuple((run.get("commit") or "").split()[1:])].append(key.split("/"))
    out = []
    for settings, keys in sorted(groups.items()):
        datasets = [d for d in DATASETS if d in {k[0] for k in keys}]
        methods = [m for m in METHODS if m in {k[1] for k in keys}]
        seeds = sorted({k[2] for k in keys if len(k) == 3}, key=int)
        words = [".venv/bin/python -m bench.qa", f"--name {stem}", "--datasets", *datasets, "--methods", *methods]
        words += ["--seeds", *seeds] if seeds else []
        words += [f"--train-s {cfg['train_s']:.0f}"] if seeds else []
        words += [f"--warm-steps {cfg['warm_steps']}"] if seeds and cfg.get("warm_steps") else []
        words += [f"--searcher {cfg['searcher']}"] if "thinker-searcher" in methods and cfg.get("searcher") else []
        words += [f"--limit {cfg['limit']}"] if cfg.get("limit") else []
        words += [f"--set {setting}" for setting in settings]
        out.append(" ".join(words))
    return out


def write_report(doc: dict, md: Path) -> None:
    cfg = doc["config"]
    commands = "; ".join(f"`{c}`" for c in reproduce_commands(doc, md.stem))
    lines = [
        "# Real multi-hop QA: HotpotQA and 2WikiMultihopQA, held-out dev questions",
        "",
        f"Written by `python -m bench.qa` (raw numbers: `{md.stem}.json.xz`); reproduce with {commands}, at the "
        "commit a row names (the recipes' defaults change between commits). "
        f"Machine: {cfg.get('machine', '?')}, no GPU. Model: SmolLM2-135M-Instruct (LoRA r16 for the trained "
        "methods). Questions: each dataset's fixed held-out split (`agents/datasets.py`, never trained on, never "
        f"a demonstration), {'the first ' + str(cfg['limit']) if cfg.get('limit') else 'all'} of them; greedy "
        f"decoding. Seeds: {', '.join(_seeds(doc)) or '–'} (the runs of a trained method are its seeds); a method "
        "missing below was not run (`--methods`). "
        "Arms (e)-(g) run the CoDA recipe (`smol-coda-*`): (e) its planner and executor demonstrations only; (f) a "
        "warm start, then GRPO + RED with the recipe's reward (per role, `agents/rewards/peco.py`, executors with "
        "their own baseline, since the recipes made it the default; the reward each run had is named under the "
        "table); (g) the same with CoDA's shared reward and the planner's advantage inherited by its executors "
        "(`CODA_ROLLOUT_CODA__REWARD_MODE=shared`, `CODA_TRAINER_ROLE_BASELINE=inherit`). (h) a Thinker trained like (d) "
        "whose searches go to a frozen searcher (`smol-thinker-*`; its searcher is named under the table). "
        "Trained methods: demonstrations of the same questions (make-sft over the train split; the CoDA arms' in "
        "CoDA's format) and "
        f"{cfg['train_s']:.0f} s of training wall time each (the RL methods' SFT warm start inside it: "
        f"{str(cfg['warm_steps']) + ' steps' if cfg.get('warm_steps') else 'the recipe’s warm_start_steps'}), one run per seed; their intervals pool the seeds (each question's score averaged over "
        "the runs). Intervals: 95% percentile bootstrap over questions (2,000 resamples). Train reward: the mean "
        "reward of the RL steps' sampled episodes (not greedy, not held out). s / SFT step: wall seconds a "
        "demonstrations-only step took, per run (the SFT run, or the RL run's warm start): the same work in every "
        "run, so it shows the machine's speed that day (it varied by 2.5x between days; compare runs of similar "
        "speed); in brackets the precision the trainer computed in (precision auto: bf16 autocast on a CPU that "
        "multiplies bf16 natively, else fp32; no bracket: recorded before the bench noted it). "
        "Commit: what each row's runs ran "
        "(`+configs`: with the recipes then uncommitted; `?`: recorded before commits were). "
        "Open and choice (`agents/question_kinds.py`): a question is a *choice* when a gold answer is yes/no or is "
        'named in the question ("Which film came out first, X or Y?"), where picking a candidate without reading '
        "scores about half; every other question is *open* (its answer has to be found by reading), so the tables "
        "lead with open-answer F1. The reading-free choice baseline answers each choice question with "
        '`guess(question)` (the first candidate the question names, else "yes"), reads nothing, and is scored '
        "with token F1 on the same choice questions as the arms (it answers no open question); ↓ marks an arm whose "
        "choice F1 is below it.",
        "",
    ]
    for dataset in DATASETS:
        if not any(_runs(doc, dataset, m) for m in METHODS):
            continue
        lines += [
            f"## {TITLES[dataset]}",
            "",
            "| method | runs | questions | **open-answer F1** [95% CI] | choice F1 [95% CI] | F1 [95% CI] | "
            "EM [95% CI] | open F1 per run | searches / q | generated tokens / q | training wall time | steps | "
            "s / SFT step | s / RL step | train reward, RL steps 1-5 → last 5 | peak RSS per service (MB) | commit |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        base = choice_baseline(doc, dataset)
        lines += [row for m in METHODS if (row := method_row(doc, dataset, m, base[0][0] if base else None))]
        if base:
            lines += [baseline_row(*base), *below_baseline(doc, dataset, base[0][0])]
        lines += rewards(doc, dataset) + searchers(doc, dataset)
        lines += ["", "F1 by question type [95% CI]:", "", *type_table(doc, dataset), *paired_table(doc, dataset)]
        lines += [*delegation_table(doc, dataset), *hierarchy_table(doc, dataset)]
        lines += ["", "Targets:", ""]
        lines += targets(doc, dataset)
        lines.append("")
    md.write_text("\n".join(lines))
