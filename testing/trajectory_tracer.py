"""The tracer of ``testing.trajectory_files``: which project files' functions run, and for which part of one
trajectory's way (``Tracer``, a ``sys.settrace`` hook), what it measured (``Measurement``) and how that is
printed (``render``). What counts is explained in ``testing.trajectory_files``.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import os
import threading
from itertools import count
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("services", "shared", "agents")
STAGES = ("rollout", "wire", "trainer")
# The trainer's steps, told apart by two functions (file, qualname): a step's groups are trained in
# ``_train_on``, whose return starts the next step (its read); the trajectory's way ends when the optimizer step
# returns, and what the step does after it (the ledger, step count, checkpoint and ack, weights publish and
# admission mark, the log record) is the step's output, listed apart.
STEP = ("services/trainer/loop.py", "Trainer._train_on")
OPTIMIZER_STEP = ("services/trainer/step.py", "train_step")
CO_OPTIMIZED = 0x1  # a function's code object (module and class bodies lack it)
ROLLOUT_THREADS = "rollout-executor"  # the rollout loop's to_thread workers (the servers' threads are others)
POLICY_THREAD = "scripted-policy"  # the scripted policy: a test fake, not a server of the stack

# Which group of the rollout a task works for: 0 the producer's own loop, k its k-th group; None: not the producer.
GROUP: contextvars.ContextVar[int | None] = contextvars.ContextVar("trajectory_group", default=None)
MEASURED = 2  # the second group and the second step: what every trajectory runs, not the first one's lazy set-up
PARTS = ("rollout", "trainer", "servers", "after_step", "first")


@dataclasses.dataclass
class Measurement:
    """Per part (``PARTS``), the functions called by file (relative to the repository), with their lines."""

    parts: dict[str, dict[str, dict[str, int]]]  # part → file → function qualname → lines
    seconds: float = 0.0

    def files(self, part: str) -> set[str]:
        return set(self.parts[part])

    @property
    def path(self) -> list[str]:
        return sorted(self.files("rollout") | self.files("trainer"))

    def stage(self, name: str) -> list[str]:
        rollout, trainer = self.files("rollout"), self.files("trainer")
        both = rollout & trainer
        return sorted({"rollout": rollout - both, "wire": both, "trainer": trainer - both}[name])

    def beyond_path(self, part: str) -> list[str]:
        """The files of ``part`` that are not on the path."""
        return sorted(self.files(part) - set(self.path))

    def functions(self, file: str, parts: tuple[str, ...] = ("rollout", "trainer")) -> dict[str, int]:
        out: dict[str, int] = {}
        for part in parts:
            out.update(self.parts[part].get(file, {}))
        return out

    def as_dict(self) -> dict:
        listed = {name: self.stage(name) for name in STAGES}
        listed |= {part: self.beyond_path(part) for part in ("servers", "after_step", "first")}
        return {
            "count": len(self.path),
            "with_servers": len(self.path) + len(listed["servers"]),
            "files": listed,
            "functions": {
                file: self.functions(file, ("rollout", "trainer") if name in STAGES else (name,))
                for name, files in listed.items()
                for file in files
            },
            "seconds": round(self.seconds, 1),
        }


class Tracer:
    """The ``sys.settrace`` hook: records each project function called, under the part it ran for."""

    def __init__(self) -> None:
        from services.rollout.producer import Producer

        self.prefixes = tuple(str(REPO / root) + os.sep for root in ROOTS)
        self.seen: dict[str, dict[int, object]] = {part: {} for part in PARTS}  # part → id(code) → code
        self.rollout_open = False  # the rollout's window: its producer, and the servers answering it
        self.trainer_thread: int | None = None  # the trainer's window: its steps, on this thread
        self.steps = 0  # the trainer's steps done (``STEP`` returned)
        self.optimizer_steps = 0  # ``OPTIMIZER_STEP`` returned
        self.stepped = False  # the current step's optimizer step returned: what follows is its output
        self.boundaries = {str(REPO / file): name for file, name in (STEP, OPTIMIZER_STEP)}
        self.producer, self.group = Producer.run.__code__, Producer._group.__code__
        self.groups = count(1)
        self.group_tasks: dict[int, asyncio.Task] = {}  # the producer's group tasks, by ordinal

    def __call__(self, frame, event, arg):
        code = frame.f_code
        if not code.co_flags & CO_OPTIMIZED or not code.co_filename.startswith(self.prefixes):
            return None
        group = GROUP.get()
        if self.rollout_open and group is not None:
            self._note("rollout" if group in (0, MEASURED) else "first", frame)
        elif self.trainer_thread is not None and threading.get_ident() == self.trainer_thread:
            return self._trainer(frame)
        elif self.rollout_open and _server_thread():
            self._note("servers", frame)
        return None

    def _trainer(self, frame):
        code = frame.f_code
        if self.stepped or self.steps >= MEASURED:
            part = "after_step"
        else:
            part = "trainer" if self.steps == MEASURED - 1 else "first"
        self._note(part, frame)
        if self.boundaries.get(code.co_filename) != code.co_qualname:
            return None
        return self._until_return(frame, self._optimizer_stepped if code.co_qualname == OPTIMIZER_STEP[1] else None)

    def _until_return(self, frame, optimizer_stepped):
        """A local trace function that only waits for ``frame`` (a step, or its optimizer step) to return."""
        frame.f_trace_lines = False

        def local(frame, event, arg):
            if event == "return":
                if optimizer_stepped is not None:
                    optimizer_stepped()
                else:
                    self.steps += 1
                    self.stepped = False
            return local

        return local

    def _optimizer_stepped(self) -> None:
        self.optimizer_steps += 1
        self.stepped = True

    def _note(self, part: str, frame) -> None:
        # By identity: code objects compare equal by content, and two functions can have the same content.
        code = frame.f_code
        if id(code) in self.seen[part] or _importing(frame):
            return
        self.seen[part][id(code)] = code  # held, so that its id stays its own

    def task_factory(self, loop, coro, context=None):
        """The loop's task factory: the producer's task, and each group's task, runs in a context marked with
        its group; every task and thread they start copies it."""
        code = getattr(coro, "cr_code", None)
        if code is not self.producer and code is not self.group:
            return asyncio.Task(coro, loop=loop, context=context)
        ordinal = 0 if code is self.producer else next(self.groups)
        context = (context or contextvars.copy_context()).copy()
        context.run(GROUP.set, ordinal)
        task = self.group_tasks[ordinal] = asyncio.Task(coro, loop=loop, context=context)
        return task

    def measurement(self, seconds: float) -> Measurement:
        parts: dict[str, dict[str, dict[str, int]]] = {}
        for part, codes in self.seen.items():
            files = parts.setdefault(part, {})
            for code in codes.values():
                file = Path(code.co_filename).relative_to(REPO).as_posix()
                files.setdefault(file, {})[code.co_qualname] = _span(code)
        return Measurement(parts, seconds)


def _server_thread() -> bool:
    thread = threading.current_thread()
    return thread is not threading.main_thread() and not thread.name.startswith((ROLLOUT_THREADS, POLICY_THREAD))


def _importing(frame) -> bool:
    """True when ``frame`` runs inside an import (the import system further up the stack)."""
    frame = frame.f_back
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _span(code) -> int:
    numbers = [line for _, _, line in code.co_lines() if line is not None]
    return max(numbers, default=code.co_firstlineno) - code.co_firstlineno + 1


HEADINGS = {
    "servers": "servers: the inference server and the retriever answering the episodes (in-process threads)",
    "after_step": "after the optimizer step, not counted: ledger, checkpoint and ack, weights publish, log record",
    "first": "the first trajectory only, not counted: lazy set-up (clients made at the first episode or step)",
}


def render(m: Measurement) -> str:
    out = [
        f"{len(m.path)} files on one trajectory's way from the rollout to the trainer's optimizer step",
        f"{len(m.path) + len(m.beyond_path('servers'))} with the servers",
    ]
    listed = [(name, m.stage(name), ("rollout", "trainer")) for name in STAGES]
    listed += [(HEADINGS[part], m.beyond_path(part), (part,)) for part in HEADINGS]
    for heading, files, parts in listed:
        out.append(f"\n{heading} ({len(files)}):")
        for file in files:
            functions = m.functions(file, parts)
            out.append(f"  {file:<40} {sum(functions.values()):>4} lines in {len(functions):>2} functions")
    out.append(f"\n(measured in {m.seconds:.0f}s; lines: those of the file's functions that ran, per part)")
    return "\n".join(out)
