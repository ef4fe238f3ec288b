"""Fault injection for the crash test: ``CODA_TRAINER_FAULT=<point>:<n>`` SIGKILLs the process the n-th time
execution reaches ``point`` (``mid_step``, ``mid_checkpoint``, ``before_ack``, ``before_publish``).

Unset (always, outside tests) it costs one dictionary lookup per call.
"""

from __future__ import annotations

import os
import signal

_hits: dict[str, int] = {}


def point(name: str) -> None:
    spec = os.environ.get("CODA_TRAINER_FAULT")
    if not spec:
        return
    target, _, count = spec.partition(":")
    if target != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
