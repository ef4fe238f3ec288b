"""Fault injection for the crash test: ``CODA_TRAINER_FAULT=<point>:<n>`` SIGKILLs the process the n-th time
execution reaches ``point`` (``mid_step``, ``mid_checkpoint``, ``before_ack``, ``before_publish``).

The variable is read once, at import: the crash test sets it for the trainer's process. Unset (always, outside
tests) ``ARMED`` is False and callers skip ``point`` altogether (``if faults.ARMED: faults.point(...)``).
"""

from __future__ import annotations

import os
import signal

_SPEC = os.environ.get("CODA_TRAINER_FAULT", "")
ARMED = bool(_SPEC)
_hits: dict[str, int] = {}


def point(name: str) -> None:
    target, _, count = _SPEC.partition(":")
    if target != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
