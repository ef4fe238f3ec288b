"""How the trainer's ranks stay together: one decision per step, bounded waits, a clean end when one is lost.

Rank 0 alone reads Redis and talks to the inference server; the others wait for it in collectives. Every
collective has a timeout (``collective_timeout_s``, set on every process group, DeepSpeed's own included),
so a rank that died, hangs or is cut off ends the job instead of hanging it. Waiting for groups is not
such a wait: rank 0 reads in a thread and all ranks meet every ``POLL_S``, so a slow rollout or a Redis
outage never looks like a lost rank. At the same meetings the ranks agree to stop when any of them was told
to (torchrun forwards SIGTERM only to its own node's workers), so they all leave the loop at the same step
and write the last checkpoint together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

import torch

from shared.log import get_logger

log = get_logger(__name__)

T = TypeVar("T")
POLL_S = 1.0  # how often waiting ranks meet while rank 0 waits for groups (well under any collective timeout)


def set_collective_timeout(seconds: float) -> None:
    """Bound every collective of every process group (the world's and those DeepSpeed created) to ``seconds``.

    ``new_group`` gives a group the backend's default (30 min for gloo), not the world group's timeout, so
    the timeout passed at init alone would leave DeepSpeed's gradient all-reduce unbounded for 30 minutes.
    """
    from torch.distributed import distributed_c10d as c10d

    for group in list(c10d._world.pg_map):
        c10d._set_pg_timeout(timedelta(seconds=seconds), group)


def lost_rank(exc: BaseException) -> bool:
    """True when ``exc`` is a collective that failed because another rank died, hung or became unreachable
    (gloo raises plain ``RuntimeError``s naming its transport; NCCL and the store raise ``DistError``s)."""
    if isinstance(exc, torch.distributed.DistError):
        return True
    return isinstance(exc, RuntimeError) and "gloo" in str(exc).lower()


class Ranks:
    """This process's place in the job, and the few collectives the loop makes itself."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def broadcast(self, obj: T | None) -> T:
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on at least one."""
        if self.world == 1:
            return flag
        value = torch.tensor([int(flag)])
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return bool(value.item())

    def gather_work(self, read: Callable[[], list[T]] | None, stop: threading.Event) -> list[T]:
        """Rank 0's ``read()`` (blocking until it has a step's worth, or until ``stop`` is set) on every rank;
        ``[]`` on every rank once any rank's ``stop`` is set (what rank 0 had read stays pending in Redis and
        is delivered again to the next start). ``read`` is None on ranks other than 0."""
        if self.world == 1:
            return read()
        done = threading.Event()
        result: dict = {}
        if self.rank == 0:
            threading.Thread(target=_run_into, args=(read, result, done), name="group-reader", daemon=True).start()
        while True:
            if self.rank == 0:
                done.wait(POLL_S)
            stopping = self.any(stop.is_set())
            if self.rank == 0 and stopping:
                stop.set()  # the job stops: cut rank 0's read (and its waits for Redis) short
                done.wait()
            ready = self.rank == 0 and done.is_set()
            if ready and "error" in result:
                raise result["error"]
            verdict = self.broadcast(("stop" if stopping else "go", result.get("value")) if ready else None)
            if verdict is not None:
                what, value = verdict
                return [] if what == "stop" else value


def _run_into(fn: Callable[[], T], result: dict, done: threading.Event) -> None:
    try:
        result["value"] = fn()
    except BaseException as exc:  # handed to the loop's thread, which raises it
        result["error"] = exc
    finally:
        done.set()
