"""The metrics glossary (``docs/metrics.md``): every number ``make train`` prints, every key of the trainer's
``train.jsonl`` and every Prometheus series the services export, with what it means.

    python -m tools.glossary > docs/metrics.md

The log's keys, their meanings and the trainer's gauges are the trainer's record (``services.trainer.metrics``,
where each is defined once). The rest is collected from the code that writes it (``ast``, nothing imported that
loads torch): the live line's keys from ``launcher/report.py``, the reward components from ``agents/``,
the Prometheus families from every ``Counter/Gauge/Histogram/...(...)`` call under ``services/`` and ``shared/``
(their help text is the description). The meanings of reward components are written here, once; ``render``
refuses to write a page with a component or a live-line key nothing describes. The docs check
(``python -m testing.docs_check``) keeps the page current.
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

from services.trainer.metrics import GAUGES, METRICS, REWARD_PREFIX

REPO = Path(__file__).resolve().parents[1]

# Every key the trainer writes to train.jsonl (one line per optimizer step), and what it means: the trainer's
# record defines them (``services.trainer.metrics``, plain dataclasses: nothing that loads torch).
LOG_KEYS: dict[str, str] = {key: m.description for key, m in METRICS.items()}

# What a reward component means (``reward/<component>`` in the log and the live line: its mean over the
# step's samples). Which ones a run shows depends on its agent's reward (or yours).
COMPONENTS: dict[str, str] = {
    "em": "exact match of the answer with a gold answer (SQuAD normalisation), 0 or 1",
    "sub_em": "a gold answer is a substring of the answer, 0 or 1",
    "cover_em": "every token of a gold answer is in the answer, 0 or 1",
    "f1": "token F1 of the answer against the best gold answer",
    "has_answer": "the episode ended with an answer, 0 or 1",
    "valid_format": "the whole response follows Search-R1's strict grammar (think before every action)",
    "retrieval_hit": "a retrieved document contains a gold answer (logged, not rewarded)",
    "answer": "the answer score the reward uses (the recipe's `answer_metric`)",
    "answer_term": "CoDA's answer term 6·score − 3",
    "planner_format": "planner's format score (tags well formed and non-empty)",
    "executor_format": "executors' mean format score",
    "refine": "an executor's refine block contains a gold answer",
    "information_reverse_rank": "best 1/rank of a document holding a gold answer",
    "num_executors": "executors the planner started in the episode",
    "parsed": "the planner's JSON plan parsed",
    "correct": "the final answer is correct",
    "token_efficiency": "1 − tokens used / token budget (recursive reasoner)",
    "independence": "share of sub-problems solvable without the others' results",
    "decomposed": "the planner split the problem, 0 or 1",
    "mrr": "best reciprocal rank of a gold document over the agent's searches",
    "answer_similarity": "cosine similarity of the answer to the gold answer (≥ 0)",
    "format": "share of the tool agent's turns that close their think block",
    "tokens": "tokens the recursive reasoner's episode used",
    "executor_score": "an executor's answer F1 against its own sub-task's expected result (per-role reward)",
    "executor_matched": "the executor's task matched a step of the plan, so it has an expected result",
    "executor_refine": "the executor's refine block contains its expected result",
    "executor_score_mean": "mean `executor_score` over the episode's executors",
    "executor_matched_mean": "mean `executor_matched` over the episode's executors",
    "executor_format_mean": "mean `executor_format` over the episode's executors",
    "executor_refine_mean": "mean `executor_refine` over the episode's executors",
    "facts_obtained": "share of the plan's facts the planner's executors obtained",
    "restated": "share of the planner's tasks that restate the question (penalised)",
    "repeated": "share of the planner's tasks that repeat an earlier task (penalised)",
    "has_plan": "the question has a plan from the data, 0 or 1",
}


@dataclass(frozen=True)
class Family:
    """One Prometheus metric family as the code defines it."""

    name: str
    kind: str
    help: str
    labels: tuple[str, ...]
    where: str


# ---------------------------------------------------------------- collected from the code
def _source(rel: str) -> ast.Module:
    return ast.parse((REPO / rel).read_text(), rel)


def _str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def progress_keys() -> tuple[str, ...]:
    """The record keys the live line shows, in order (the literal tuple ``training_progress`` loops over)."""
    for node in ast.walk(_source("launcher/report.py")):
        if isinstance(node, ast.FunctionDef) and node.name == "training_progress":
            for loop in ast.walk(node):
                if isinstance(loop, ast.For) and isinstance(loop.iter, ast.Tuple):
                    return tuple(s for s in map(_str, loop.iter.elts) if s)
    raise LookupError("launcher/report.py: training_progress no longer loops over a tuple of keys")


def eval_metrics() -> tuple[str, ...]:
    """The rows of the closing table (``EVAL_METRICS``)."""
    for node in _source("launcher/report.py").body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "EVAL_METRICS" for t in node.targets):
            return tuple(s for s in map(_str, node.value.elts) if s)
    raise LookupError("launcher/report.py has no EVAL_METRICS")


def trainer_gauges() -> dict[str, str]:
    """Each trainer gauge's Prometheus name (``coda_trainer_<key>``, ``/`` as ``_``) → the record key it shows."""
    return {m.prometheus: m.key for m in GAUGES}


def reward_components() -> set[str]:
    """Component names the shipped rewards return (keys of ``components`` dicts, and the answer scores)."""
    names: set[str] = set()
    for path in sorted((REPO / "agents").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        tuples = {
            t.id: [s for s in map(_str, n.value.elts) if s]
            for n in tree.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Tuple)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            # ``{f"{k}_mean": … for k in _EXECUTOR_MEANS}``: one component per name of a module-level tuple
            if isinstance(node, ast.DictComp) and isinstance(node.key, ast.JoinedStr):
                loop = node.generators[0]
                if isinstance(loop.iter, ast.Name) and loop.iter.id in tuples:
                    suffix = "".join(_str(v) or "" for v in node.key.values)
                    names.update(k + suffix for k in tuples[loop.iter.id])
            named = isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "components" for t in node.targets)
            if (named or (isinstance(node, ast.keyword) and node.arg == "components")) and isinstance(
                node.value, ast.Dict
            ):
                names.update(k for k in map(_str, node.value.keys) if k)
    answers = _source("agents/answers.py")
    for node in ast.walk(answers):
        if isinstance(node, ast.FunctionDef) and node.name == "answer_scores":
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict):
                    names.update(k for k in map(_str, ret.value.keys) if k)
    return names


_KINDS = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}
_FAMILY_KINDS = {"CounterMetricFamily": "Counter", "GaugeMetricFamily": "Gauge"}


def _labels(call: ast.Call) -> tuple[str, ...]:
    node = call.args[2] if len(call.args) > 2 else None
    for kw in call.keywords:
        if kw.arg in ("labelnames", "labels"):
            node = kw.value
    if isinstance(node, ast.List | ast.Tuple):
        return tuple(s for s in map(_str, node.elts) if s)
    return ()


@functools.cache
def prometheus_families() -> tuple[Family, ...]:
    """Every family a ``Counter/Gauge/Histogram/Summary/Info/Enum(...)`` (or ``…MetricFamily``) call under
    ``services/`` and ``shared/`` defines; the trainer's per-key gauges expanded from the record's ``GAUGES``."""
    files = sorted([*REPO.glob("services/**/*.py"), *REPO.glob("shared/**/*.py")])
    trees = {p: ast.parse(p.read_text(), str(p)) for p in files}
    constants = {
        t.id: v
        for tree in trees.values()
        for n in tree.body
        if isinstance(n, ast.Assign) and (v := _str(n.value))
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    out: dict[str, Family] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            kind = getattr(func, "id", None) or getattr(func, "attr", None)
            kind = _FAMILY_KINDS.get(kind, kind)
            if kind not in _KINDS or not node.args:
                continue
            where = f"{path.relative_to(REPO)}"
            first, second = node.args[0], node.args[1] if len(node.args) > 1 else None
            name = _str(first) or (constants.get(first.id) if isinstance(first, ast.Name) else None)
            name = name or (constants.get(first.attr) if isinstance(first, ast.Attribute) else None)
            if name is None:
                continue
            help_text = _str(second) or ""
            if name not in out or (not out[name].help and help_text):
                out[name] = Family(name, kind, help_text, _labels(node), where)
    # The trainer's per-key gauges are named by the record's metrics (``Metric.prometheus``), not in the source.
    where = "services/trainer/observe.py"
    out.update({m.prometheus: Family(m.prometheus, "Gauge", m.help, (), where) for m in GAUGES})
    return tuple(sorted(out.values(), key=lambda f: f.name))


# ---------------------------------------------------------------- the page
def check() -> list[str]:
    """What the code writes that nothing describes (reward components, the live line's keys, Prometheus help)."""
    problems = []
    for key in sorted(reward_components() - set(COMPONENTS)):
        problems.append(f"reward component {key!r} has no description in tools/glossary.py COMPONENTS")
    for key in progress_keys():
        if not key.startswith(REWARD_PREFIX) and key not in LOG_KEYS:
            problems.append(f"the live line shows {key!r}, which the trainer's record does not define")
    for family in prometheus_families():
        if not family.help:
            problems.append(f"Prometheus family {family.name} ({family.where}) has no help text")
    return problems


def _row(*cells: str) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _key_meaning(key: str) -> str:
    if key.startswith(REWARD_PREFIX):
        component = key.removeprefix(REWARD_PREFIX)
        return f"mean over the step's samples of the reward component `{component}`: {COMPONENTS[component]}"
    return LOG_KEYS[key]


def render() -> str:
    problems = check()
    if problems:
        raise ValueError("the metrics glossary is out of step with the code:\n  " + "\n  ".join(problems))
    gauge_of = {key: name for name, key in trainer_gauges().items()}
    lines = [
        "# Metrics glossary",
        "",
        "Generated from the code that writes the metrics by `python -m tools.glossary > docs/metrics.md`;",
        "do not edit by hand (`make lint` checks that it is current).",
        "",
        "## The live line of `make train`",
        "",
        "```",
        "[make train 01:37:54] training: step 14/25 315s 22 s/step  ETA 4m01s reward_mean=0.625 reward/f1=0.625 ...",
        "```",
        "",
        "In order: the clock; the phase; the last logged optimizer step / the recipe's `max_steps` (∞: none);",
        "seconds since training began; the pace over the steps this session has seen (`steps/s`, or `s/step`",
        "when slower than 0.1 steps/s; `measuring pace` until two steps were seen); the time left at that pace;",
        "then these keys of the last line of `train.jsonl`, each shown when the step wrote it:",
        "",
        _row("key", "meaning"),
        "|---|---|",
        *[_row(f"`{key}`", _key_meaning(key)) for key in progress_keys()],
        "",
        "## The closing table",
        "",
        "Greedy evals of the held-out questions (step 0, the warm start if the run has one, the end), each row the",
        "mean over the questions:",
        "",
        _row("row", "meaning"),
        "|---|---|",
        *[_row(f"`{key}`", _EVAL_MEANINGS.get(key) or COMPONENTS[key]) for key in eval_metrics()],
        _row(
            "training reward",
            "mean `reward_mean` of the first and the last 5 logged steps (sampled, not greedy; after a warm "
            "start its first column is empty)",
        ),
        "",
        "## `train.jsonl`: one line per optimizer step",
        "",
        "In the run folder's `trainer/train.jsonl` (`runs/train/<time>/`), plotted in `rewards.png` and",
        "`losses.png`, sent to wandb when configured. A key is left out when the step did not measure it.",
        "",
        _row("key", "meaning", "Prometheus gauge"),
        "|---|---|---|",
        *[_row(f"`{key}`", LOG_KEYS[key], f"`{gauge_of[key]}`" if key in gauge_of else "") for key in sorted(LOG_KEYS)],
        _row("`reward/<component>`", "mean over the step's samples of one named reward component (below)", ""),
        "",
        "## Reward components (`reward/<component>`)",
        "",
        "A reward returns a scalar and named components; the log shows each component's mean over the step's",
        "samples. Which ones appear depends on the agent's reward; a reward of your own adds its own names.",
        "",
        _row("component", "meaning"),
        "|---|---|",
        *[_row(f"`{key}`", COMPONENTS[key]) for key in sorted(COMPONENTS)],
        "",
        "## Prometheus",
        "",
        "Every service serves `GET /metrics`; counters add `_total`, histograms `_bucket`/`_sum`/`_count`.",
        "The help text is the code's own.",
        "",
        _row("series", "kind", "labels", "meaning", "defined in"),
        "|---|---|---|---|---|",
        *[_row(f"`{f.name}`", f.kind, ", ".join(f.labels), f.help, f"`{f.where}`") for f in prometheus_families()],
        "",
    ]
    return "\n".join(lines)


_EVAL_MEANINGS = {
    "search_entity": "the first search is well formed and names the question's entity",
    "search_hit": "the first search retrieves the gold document",
    "reward": "the recipe's own reward of each greedy episode (what a reward with no gold answers is judged by)",
}


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tools.glossary", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="list what the code writes and the glossary misses")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        sys.stdout.write("\n".join(problems or ["the glossary describes every metric"]) + "\n")
        return 1 if problems else 0
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
