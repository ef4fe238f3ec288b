"""The dashboards' building blocks: a panel, a dashboard, PromQL helpers (used by dashboards.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

RATE = "$__rate_interval"


@dataclass
class Panel:
    title: str
    targets: list[tuple[str, str]]  # (PromQL, legend)
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | stat
    description: str = ""
    width: int = 12


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    rows: list[tuple[str, list[Panel]]] = field(default_factory=list)


def quantile(q: float, metric: str, by: str = "", where: str = "") -> str:
    labels = f"{{{where}}}" if where else ""
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{labels}[{RATE}])))"


def mean_of(metric: str, by: str = "", where: str = "") -> str:
    labels = f"{{{where}}}" if where else ""
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({metric}_sum{labels}[{RATE}])) / sum{group} (rate({metric}_count{labels}[{RATE}]))"
