"""Which Prometheus series our code exports, collected from the source, and which PromQL uses.

Every ``Counter/Gauge/Histogram/Summary/Info/Enum(...)`` call (and ``Counter/GaugeMetricFamily(...)``) under ``services/`` and ``shared/`` is read
with ``ast``; its name argument may be a literal, a module constant (also one imported from another module,
e.g. ``shared.metrics.HTTP_REQUESTS``) or an f-string (its holes become wildcards). The trainer's gauges are
named by its metric records (``services.trainer.metrics.GAUGES``, ``Metric.prometheus``): those are taken
from the records themselves. The series a family
exports follow prometheus_client's rules: counters end in ``_total``; histograms add ``_bucket``/``_sum``/
``_count``; summaries ``_sum``/``_count``; info ``_info``. ``test_dashboards`` ties this static view to a
real ``/metrics`` scrape so that the two cannot drift apart.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

KINDS = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}
# Families a custom collector yields at scrape time (``services.rollout.metrics.FleetCollector``).
COLLECTOR_KINDS = {"CounterMetricFamily": "Counter", "GaugeMetricFamily": "Gauge"}


@dataclass(frozen=True)
class Family:
    kind: str
    name: str  # the name as written (an f-string's holes become ".+" in ``pattern``)
    where: str

    @property
    def pattern(self) -> str:
        return self.name if self.name.startswith("re:") else re.escape(self.name)

    def series(self) -> list[str]:
        """Regexes of the series names this family exports."""
        base = self.pattern.removeprefix("re:")
        if self.kind == "Counter":
            base = re.sub(r"_total$", "", base)
            return [base + "_total", base + "_created"]
        if self.kind == "Histogram":
            return [base + s for s in ("_bucket", "_sum", "_count", "_created")]
        if self.kind == "Summary":
            return [base, base + "_sum", base + "_count", base + "_created"]
        if self.kind == "Info":
            return [base + "_info"]
        return [base]


def _constants(tree: ast.Module) -> dict[str, str]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.value
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            out[node.target.id] = node.value.value
    return out


def _collections(tree: ast.Module) -> dict[str, list[str]]:
    """Module-level literal collections of strings: dict keys, lists, tuples, sets."""
    out = {}
    for node in tree.body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        items = (
            value.keys
            if isinstance(value, ast.Dict)
            else value.elts
            if isinstance(value, ast.List | ast.Tuple | ast.Set)
            else None
        )
        if items and all(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items):
            for target in targets:
                if isinstance(target, ast.Name):
                    out[target.id] = [i.value for i in items]
    return out


def _loop_values(tree: ast.Module, collections: dict[str, list[str]]) -> dict[int, dict[str, list[str]]]:
    """For every node inside a ``for``/comprehension over a literal collection: loop variable → values."""
    scopes: dict[int, dict[str, list[str]]] = {}
    for node in ast.walk(tree):
        loops = (
            node.generators
            if isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp)
            else [node]
            if isinstance(node, ast.For)
            else []
        )
        for loop in loops:
            values = collections.get(loop.iter.id) if isinstance(loop.iter, ast.Name) else None
            if values and isinstance(loop.target, ast.Name):
                for inner in ast.walk(node):
                    scopes.setdefault(id(inner), {})[loop.target.id] = values
    return scopes


def _expand(node: ast.JoinedStr, loop: dict[str, list[str]]) -> list[str] | None:
    """An f-string whose only hole is a loop variable over a literal collection → its concrete values."""
    holes = [v for v in node.values if not isinstance(v, ast.Constant)]
    if len(holes) != 1 or not isinstance(holes[0].value, ast.Name) or holes[0].value.id not in loop:
        return None
    names = []
    for value in loop[holes[0].value.id]:
        names.append("".join(str(v.value) if isinstance(v, ast.Constant) else value for v in node.values))
    return names


def _name_of(node: ast.expr, local: dict[str, str], everywhere: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return local.get(node.id, everywhere.get(node.id))
    if isinstance(node, ast.Attribute):  # metrics.HTTP_REQUESTS
        return everywhere.get(node.attr)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(re.escape(str(value.value)))
            else:
                parts.append("[a-zA-Z0-9_:]+")
        return "re:" + "".join(parts)
    return None


def _kind(call: ast.Call) -> str | None:
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    name = COLLECTOR_KINDS.get(name, name)
    return name if name in KINDS else None


@functools.cache
def exported_families(root: Path) -> tuple[Family, ...]:
    """Every metric family defined under ``services/`` and ``shared/``."""
    files = sorted([*root.glob("services/**/*.py"), *root.glob("shared/**/*.py")])
    trees = {path: ast.parse(path.read_text(), str(path)) for path in files}
    everywhere: dict[str, str] = {}
    for tree in trees.values():
        everywhere.update(_constants(tree))
    families = []
    for path, tree in trees.items():
        local, loops = _constants(tree), _loop_values(tree, _collections(tree))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and (kind := _kind(node))):
                continue
            arg = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "name"), None)
            where = f"{path.relative_to(root)}:{node.lineno}"
            expanded = _expand(arg, loops.get(id(arg), {})) if isinstance(arg, ast.JoinedStr) else None
            names = expanded or ([] if arg is None else [_name_of(arg, local, everywhere)])
            families.extend(Family(kind, name, where) for name in names if name is not None)
    from services.trainer.metrics import GAUGES  # pure Python

    families.extend(Family("Gauge", m.prometheus, "services/trainer/metrics.py") for m in GAUGES)
    return tuple(families)


def exported_series(families: tuple[Family, ...]) -> list[str]:
    return [series for family in families for series in family.series()]


# ---------------------------------------------------------------- PromQL
_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'')
_BRACES = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
    "atan2",
}


def promql_metrics(expr: str) -> set[str]:
    """Metric names in a PromQL expression (functions, labels, ranges, keywords and numbers removed)."""
    text = _STRINGS.sub(" ", expr)
    text = _BRACES.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        word = match.group(0)
        following = text[match.end() :].lstrip()
        if following.startswith("(") or word.lower() in KEYWORDS or word.startswith("$"):
            continue
        before = text[match.start() - 1] if match.start() else " "
        if before == "$" or before.isalnum() or before == ".":  # a Grafana variable, or 1e-3 / 5m
            continue
        names.add(word)
    return names
