"""What ``make train`` shows at the terminal: a line per phase, and one live line with the pace of the work.

On a terminal the live line is redrawn in place (the phase, the step, steps/s, the ETA, the last rewards)
and every other line is printed above it; elsewhere (a pipe, CI, a log file) each update is a plain line.
The services' and the stack's own logs go to the run folder (``logs/``), not here.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from typing import TextIO

CLEAR = "\r\x1b[2K"  # back to the line's start and erase it


@dataclass
class Pace:
    """Steps per second and time left, from the steps this process has seen (a resumed run's earlier steps
    ran at another time and do not count)."""

    max_steps: int
    first: tuple[int, float] | None = None  # (step, time) when the first step was seen

    def update(self, step: int, now: float) -> tuple[float | None, float | None]:
        """(steps/s, seconds left): None until two different steps were seen (or without ``max_steps``)."""
        if self.first is None or step < self.first[0]:
            self.first = (step, now)
        done, seconds = step - self.first[0], now - self.first[1]
        if done <= 0 or seconds <= 0:
            return None, None
        rate = done / seconds
        left = (self.max_steps - step) / rate if self.max_steps else None
        return rate, left


def duration(seconds: float) -> str:
    """4s, 3m05s, 2h07m."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def pace_text(rate: float | None, left: float | None) -> str:
    if rate is None:
        return "measuring pace"
    per = f"{rate:.2f} steps/s" if rate >= 0.1 else f"{1 / rate:.0f} s/step"
    return per + ("" if left is None else f"  ETA {duration(left)}")


class Display(logging.Handler):
    """The terminal's view of a run; also a logging handler that shows warnings (a dead service) above the
    live line. A terminal that went away (SIGHUP) makes writing a no-op: the run stops on its own."""

    def __init__(self, who: str = "make train", stream: TextIO | None = None, live: bool | None = None) -> None:
        super().__init__(logging.WARNING)
        self.who = who
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self.line = ""  # the live line on screen now (terminal only)
        self.last_plain: float | None = None  # when the last plain status line was printed

    def say(self, message: str) -> None:
        """A line of its own, kept on screen."""
        self.block(f"[{self.who} {time.strftime('%H:%M:%S')}] {message}")

    def block(self, text: str) -> None:
        """Text as it is (the summary), kept on screen."""
        text += "\n"
        self._write(CLEAR + text + self.line if self.live and self.line else text)

    def status(self, message: str, plain_every_s: float = 0.0) -> None:
        """The live line: redrawn in place on a terminal; elsewhere a plain line at most every ``plain_every_s``."""
        if not self.live:
            if self.last_plain is None or time.monotonic() - self.last_plain >= plain_every_s:
                self.last_plain = time.monotonic()
                self.say(message)
            return
        self.line = f"[{self.who} {time.strftime('%H:%M:%S')}] {message}"
        self._write(CLEAR + self.line)

    def keep(self) -> None:
        """End the live line: it stays on screen as it is, the next output goes below it."""
        if self.live and self.line:
            self._write("\n")
        self.line = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.say(f"{record.levelname.lower()}: {record.getMessage()}")

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal is gone (EIO) or closed
            pass
