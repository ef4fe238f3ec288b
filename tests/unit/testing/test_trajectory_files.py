"""The trajectory file counter's bookkeeping: which part a traced call belongs to, and how parts make stages.

The whole run (servers, rollout, trainer) is tests/integration/testing/test_trajectory_files.py; here the tracer
sees real calls of project functions (``agents.answers``, ``shared.tags``) made from stand-in producer and group
coroutines, and stand-in trainer frames.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from types import SimpleNamespace

from agents.answers import exact_match, normalize_answer, token_f1
from shared.tags import close_tag, open_tag
from testing.trajectory_tracer import MEASURED, OPTIMIZER_STEP, REPO, STEP, Measurement, Tracer, render

ANSWERS, TAGS = "agents/answers.py", "shared/tags.py"


def _traced(tracer: Tracer, coroutine) -> None:
    threading.settrace(tracer)
    sys.settrace(tracer)
    try:
        asyncio.run(coroutine)
    finally:
        sys.settrace(None)
        threading.settrace(None)


def test_the_producer_and_the_measured_group_are_the_path_the_first_group_is_apart():
    tracer = Tracer()

    async def group(ordinal: int) -> None:
        if ordinal == 1:
            await asyncio.to_thread(normalize_answer, "The first")  # a thread started by the group: its context
        else:
            await asyncio.create_task(asyncio.to_thread(open_tag, "answer"))  # a task of the group, its thread

    async def producer() -> None:
        close_tag("answer")  # the producer's own loop
        for ordinal in range(1, MEASURED + 1):
            await asyncio.get_running_loop().create_task(group(ordinal))

    tracer.producer, tracer.group = producer.__code__, group.__code__

    async def rollout() -> None:
        asyncio.get_running_loop().set_task_factory(tracer.task_factory)
        tracer.rollout_open = True
        await asyncio.create_task(producer())
        exact_match("x", ["x"])  # not the producer's: the rollout's start-up or a background task
        tracer.rollout_open = False

    _traced(tracer, rollout())
    m = tracer.measurement(0.0)
    assert m.functions(TAGS, ("rollout",)).keys() == {"open_tag", "close_tag"}
    assert "normalize_answer" in m.functions(ANSWERS, ("first",))
    assert ANSWERS not in m.files("rollout") and not m.files("servers") and not m.files("trainer")
    assert sorted(tracer.group_tasks) == [0, 1, 2]


def _frame(function, boundary: tuple[str, str] | None = None) -> SimpleNamespace:
    code = function.__code__
    if boundary is not None:  # a stand-in for the trainer's step function or its optimizer step
        code = code.replace(co_filename=str(REPO / boundary[0]), co_qualname=boundary[1])
    return SimpleNamespace(f_code=code, f_back=None, f_trace_lines=True)


def test_the_measured_step_until_its_optimizer_step_is_the_path_what_follows_is_not():
    tracer = Tracer()
    tracer.trainer_thread = threading.get_ident()

    def call(frame, *inside) -> None:
        local = tracer(frame, "call", None)
        for nested in inside:
            call(*nested)
        if local is not None:
            local(frame, "return", None)

    def step(*before, after=()) -> None:
        call(_frame(normalize_answer, STEP), *before, (_frame(token_f1, OPTIMIZER_STEP), *before), *after)

    call(_frame(exact_match))  # the first step's read
    step((_frame(exact_match),), after=[(_frame(close_tag),)])  # trained, then its publish (say)
    call(_frame(open_tag))  # the second step's read
    step((_frame(normalize_answer),), after=[(_frame(close_tag),)])
    call(_frame(close_tag))  # the run's end: its last checkpoint
    m = tracer.measurement(0.0)
    assert m.functions(TAGS, ("trainer",)).keys() == {"open_tag"}
    assert m.functions(ANSWERS, ("trainer",)).keys() == {"normalize_answer"}
    assert m.functions(ANSWERS, ("first",)).keys() == {"exact_match"}
    assert m.functions("services/trainer/step.py", ("trainer",)).keys() == {"train_step"}
    assert m.functions(TAGS, ("after_step",)).keys() == {"close_tag"} and not m.files("rollout")
    assert (tracer.steps, tracer.optimizer_steps, tracer.stepped) == (2, 2, False)


def test_stages_wire_and_what_lies_beside_the_path():
    def part(*files: str) -> dict[str, dict[str, int]]:
        return {f: {"f": 3} for f in files}

    m = Measurement(
        {
            "rollout": part("a.py", "wire.py"),
            "trainer": part("wire.py", "t.py"),
            "servers": part("wire.py", "server.py"),
            "after_step": part("t.py", "log.py"),
            "first": part("client.py"),
        }
    )
    assert m.path == ["a.py", "t.py", "wire.py"]
    assert (m.stage("rollout"), m.stage("wire"), m.stage("trainer")) == (["a.py"], ["wire.py"], ["t.py"])
    out = m.as_dict()
    assert (out["count"], out["with_servers"]) == (3, 4)
    assert out["files"]["servers"] == ["server.py"] and out["files"]["after_step"] == ["log.py"]
    assert out["functions"]["wire.py"] == {"f": 3}
    text = render(m)
    assert text.startswith("3 files on one trajectory's way") and "4 with the servers" in text
    assert "  a.py" in text and "server.py" in text and "client.py" in text
