"""The local stack: runs the services as local processes for ``make train`` (no Docker, no GPU).

Not a container of its own: it only launches the others by their command lines and watches them.

Its public API, what ``make train`` runs on and tools beside it (``bench/``) drive the stack through; import
these names from ``launcher``, not from its modules:

- ``LocalStack(recipe, settings, run=, layout=, say=)``: one run of a recipe. ``prepare``, ``start_servers``,
  ``make_sft``, ``job`` (a one-shot command), ``trainer_service``, ``rollout_service``, ``searcher_service``,
  ``retriever_service``, ``restart_inference``, ``load_adapter``, ``load_last_adapter``, ``url``, ``ports``,
  ``layout``, ``settings``;
- ``StackSettings`` (``[stack]`` of a recipe), ``Layout`` (where model, index, demonstrations and evals go);
- ``Supervisor``, ``Service``: the processes of a run, stopped together;
- ``eval_args``, ``read_eval``, ``EvalResult``, ``read_log``: a held-out eval's command and results, the
  trainer's log;
- ``threads_for``, ``checkpoint_step``, ``start_from_checkpoint``;
- ``monitor_for``, ``AlertSettings``: the RL-health alerts' in-process check of a run and its thresholds.

Names resolve on first use, so ``python -m launcher --help`` imports none of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_API = {
    "LocalStack": "launcher.train",
    "StackSettings": "launcher.config",
    "Layout": "launcher.prepare",
    "eval_args": "launcher.prepare",
    "Supervisor": "launcher.supervisor",
    "Service": "launcher.supervisor",
    "EvalResult": "launcher.report",
    "read_eval": "launcher.report",
    "read_log": "launcher.report",
    "threads_for": "launcher.processes",
    "checkpoint_step": "launcher.processes",
    "start_from_checkpoint": "launcher.runs",
    "monitor_for": "launcher.alerts.monitor",
    "AlertSettings": "launcher.alerts.settings",
}
__all__ = [  # the names of _API
    "AlertSettings",
    "EvalResult",
    "Layout",
    "LocalStack",
    "Service",
    "StackSettings",
    "Supervisor",
    "checkpoint_step",
    "eval_args",
    "monitor_for",
    "read_eval",
    "read_log",
    "start_from_checkpoint",
    "threads_for",
]

if TYPE_CHECKING:
    from launcher.alerts.monitor import monitor_for
    from launcher.alerts.settings import AlertSettings
    from launcher.config import StackSettings
    from launcher.prepare import Layout, eval_args
    from launcher.processes import checkpoint_step, threads_for
    from launcher.report import EvalResult, read_eval, read_log
    from launcher.runs import start_from_checkpoint
    from launcher.supervisor import Service, Supervisor
    from launcher.train import LocalStack


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value
