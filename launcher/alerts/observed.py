"""What ``make train`` sees of a run when it evaluates the alerts: the trainer's step records (train.jsonl,
``services.trainer.step_record``) and the rollout's ``/metrics`` scraped over time."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Scrape:
    """One scrape: ``samples[name]`` maps a sample's labels (sorted ``(key, value)`` pairs) to its value."""

    time: float
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = field(default_factory=dict)

    def series(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return self.samples.get(name, {})

    def total(self, name: str, **labels: str) -> float | None:
        """The sum of ``name``'s samples whose labels include ``labels`` (None: no such sample)."""
        wanted = set(labels.items())
        values = [v for key, v in self.series(name).items() if wanted <= set(key)]
        return sum(values) if values else None


def parse_scrape(text: str, time: float) -> Scrape:
    """A Prometheus text exposition (a service's ``/metrics``) as a ``Scrape``."""
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = float(sample.value)
    return Scrape(time, samples)


@dataclass(frozen=True)
class Observed:
    """The run so far. ``started``: when watching began (a resumed run's older records do not make its trainer
    look stalled before its first new step)."""

    records: list[dict]
    scrapes: list[Scrape]
    now: float
    started: float

    def values(self, key: str) -> list[float]:
        """``key`` of every record that has it, oldest first (non-finite values included)."""
        return [float(r[key]) for r in self.records if isinstance(r.get(key), int | float)]

    def last(self, key: str) -> float | None:
        values = self.values(key)
        return values[-1] if values else None


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def rolling_means(values: list[float], width: int) -> list[float]:
    """Means of every full window of ``width`` consecutive values."""
    return [mean(values[i - width : i]) for i in range(width, len(values) + 1)]


def finite(value: float) -> bool:
    return math.isfinite(value)
