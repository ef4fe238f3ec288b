"""``make train``'s alerts: every few seconds, the rules' checks over the trainer's step records and a scrape
of the rollout's ``/metrics``; says each alert once when it starts firing (and when it clears), and keeps what
fired for the closing table."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from launcher.alerts.observed import Observed, Scrape, parse_scrape
from launcher.alerts.rules import RULES, Rule
from launcher.alerts.settings import AlertSettings
from shared.log import get_logger

log = get_logger(__name__)

SCRAPES_KEPT = 1000  # ~4 h at the 15 s of a non-terminal progress tick: more than any window reads


@dataclass
class Fired:
    rule: Rule
    step: int  # the last logged step when it first fired
    detail: str  # the numbers, when it first fired
    times: int = 1  # how often it started firing
    firing: bool = True


class Monitor:
    """The alerts of one training session. ``read_records`` gives the step records so far; ``metrics_url`` is
    the rollout's ``/metrics`` (None: rules that need it stay quiet)."""

    def __init__(
        self,
        settings: AlertSettings,
        read_records: Callable[[], list[dict]],
        metrics_url: str | None = None,
        say: Callable[[str], None] = log.warning,
        every_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings, self.read_records, self.metrics_url = settings, read_records, metrics_url
        self.say, self.every_s, self.clock = say, every_s, clock
        self.started = clock()
        self.scrapes: deque[Scrape] = deque(maxlen=SCRAPES_KEPT)
        self.fired: dict[str, Fired] = {}
        self.last_tick: float | None = None

    def tick(self, force: bool = False) -> None:
        """Evaluate, at most every ``every_s`` (it is called on every progress tick); ``force``: now (the last
        steps of a session that just ended are judged too)."""
        now = self.clock()
        recent = self.last_tick is not None and now - self.last_tick < self.every_s
        if not self.settings.enabled or (recent and not force):
            return
        self.last_tick = now
        if self.metrics_url and (scrape := self._scrape(now)) is not None:
            self.scrapes.append(scrape)
        self.evaluate(Observed(self.read_records(), list(self.scrapes), now, self.started))

    def evaluate(self, observed: Observed) -> list[str]:
        """Run every rule; say and return the lines of alerts that started or stopped firing."""
        step = int(observed.records[-1].get("step", 0)) if observed.records else 0
        lines = []
        for rule in RULES:
            detail = rule.check(observed, self.settings)
            known = self.fired.get(rule.name)
            if detail and (known is None or not known.firing):
                if known is None:
                    self.fired[rule.name] = Fired(rule, step, detail)
                else:
                    known.firing, known.times = True, known.times + 1
                lines.append(f"alert {rule.name} (step {step}): {detail} — {rule.action}")
            elif not detail and known is not None and known.firing:
                known.firing = False
                lines.append(f"alert {rule.name} cleared (step {step})")
        for line in lines:
            self.say(line)
        return lines

    def _scrape(self, now: float) -> Scrape | None:
        try:
            response = httpx.get(self.metrics_url, timeout=1.0)
            response.raise_for_status()
        except httpx.HTTPError:  # the rollout not up yet, or gone: its rules see no new scrape
            return None
        return parse_scrape(response.text, now)


def summary_lines(fired: dict[str, Fired], docs: str = "docs/alerts.md") -> list[str]:
    """The closing table's alert rows: what fired, first at which step, and whether it still fires."""
    if not fired:
        return ["alerts:      none fired"]
    lines = [f"alerts fired ({docs} says what to do):"]
    for f in fired.values():
        state = "still firing" if f.firing else "cleared"
        again = f", fired {f.times}×" if f.times > 1 else ""
        lines.append(f"  {f.rule.name:<20} first at step {f.step}{again}, {state}: {f.detail}")
    return lines


def monitor_for(recipe: str, log_file: Path, rollout_port: int | None, say: Callable[[str], None]) -> Monitor:
    """The monitor of a ``make train`` session: the recipe's ``[alerts]``, its trainer's log, its rollout."""
    from launcher.report import read_log

    url = f"http://127.0.0.1:{rollout_port}/metrics" if rollout_port else None
    return Monitor(AlertSettings.load(recipe), lambda: read_log(log_file), url, say)
