"""How many project files one trajectory passes from the rollout to the trainer: measured by running one.

    python -m testing.trajectory_files                # the count, then the files by stage
    python -m testing.trajectory_files --max 25       # exit 1 when more than 25 files are on the path
    python -m testing.trajectory_files --json out.json

What runs, in this one process (the tiny-cpu recipe, ``make train``'s, cut to one group per step): a real
Redis; the real retriever over the bundled lookup corpus (sparse-only, as tiny-cpu serves it) and the real CPU
inference server with a tiny model, each on a thread; the rollout app's own lifespan
(``services.rollout.app.build_app``) until its producer has published two groups; then
``services.trainer.loop.Trainer``, set up and run for two steps on them. The second group and the second step
are what is counted (``MEASURED``): the first trajectory also makes what is then kept (the clients of a server,
the reward function), listed apart. The policy's turns are scripted (``testing.fake_llm``): a tiny untrained
model never searches, and the path of an agent that does is the one that matters. The script searches for the
question, then answers it, right in every other episode (a group with a reward spread: GRPO trains on it).
Every completion request is also sent to the real inference server, whose work counts as the servers'.

What counts: a file under services/, shared/ or agents/ counts once one of its functions is called on the
trajectory's behalf (``sys.settrace`` on every thread; module and class bodies never count, nor calls made
while a module is being imported, so start-up and imports do not):
- rollout: the producer's own loop (``Producer.run``: admission, the prompt) and the measured group's task
  (``Producer._group``) with all it starts (its episodes' tasks, its ``to_thread`` calls): the episode, the
  reward, encoding and the XADD. Not the rollout's start-up, its background tasks (weight follower, fleet
  watch) or its HTTP routes;
- trainer: ``Trainer.run``'s measured step, from the stream read until the optimizer step returns
  (``OPTIMIZER_STEP``), but not what the step does afterwards (the ledger, step count, checkpoint and ack,
  weights publish and admission mark, the log record), listed apart;
- wire: files both ends ran (the message types, the stream);
- servers: what the inference server and the retriever ran while answering both groups' episodes (their
  threads).
The count is rollout + wire + trainer; "with the servers" adds the servers' files.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import count
from pathlib import Path

from testing.trajectory_tracer import (
    MEASURED,
    OPTIMIZER_STEP,
    POLICY_THREAD,
    REPO,
    ROLLOUT_THREADS,
    STEP,
    Measurement,
    Tracer,
    render,
)

RECIPE = REPO / "configs" / "tiny-cpu.toml"
LOOKUP = REPO / "data" / "lookup"


# ---------------------------------------------------------------- the pieces of the run
class Tee:
    """ASGI app: the scripted policy answers each completion request, after the real inference server was sent
    the same request (its answer is checked, then dropped), so the server runs what the episodes asked."""

    def __init__(self, app, server_url: str) -> None:
        self.app, self.server_url, self.statuses = app, server_url, []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/completions":
            return await self.app(scope, receive, send)
        import httpx

        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        async with httpx.AsyncClient(timeout=120) as client:
            answer = await client.post(
                f"{self.server_url}/v1/completions", content=body, headers={"content-type": "application/json"}
            )
        self.statuses.append(answer.status_code)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def scripted_policy(records):
    """A Search-R1 policy: search for the question, then answer, right in every other episode."""
    from agents.prompts import question_text

    gold = {question_text(r.question): r.golden_answers[0] for r in records}
    answers = count()

    def script(prompt: str, model: str) -> str:
        question = max((q for q in gold if q in prompt), key=len, default=None)
        if question is None:
            raise ValueError("the scripted policy got a prompt with no known question")
        if "<information>" not in prompt.rsplit(question, 1)[1]:
            return f"<search> {question} </search>"
        return f"<answer> {gold[question] if next(answers) % 2 == 0 else 'unknown'} </answer>"

    return script


@contextlib.contextmanager
def served(app, name: str) -> Iterator[str]:
    from testing.serving import ThreadedServer

    server = ThreadedServer(app)
    server.thread.name = name
    with server as url:
        yield url


def build_pieces(work: Path) -> tuple[Path, Path]:
    """The tiny model (trained tokenizer, random weights) and a lookup index (the sparse side is what serves)."""
    import numpy as np

    from services.inference.factory import build_tiny_model, read_texts
    from services.retriever.build import BuildOptions, build_index

    texts = read_texts([LOOKUP / "corpus.jsonl", LOOKUP / "train.jsonl"], limit=600)
    model = build_tiny_model(work / "tiny", texts, size="tiny", seed=0, vocab_size=1024, max_len=2048)
    rows = len((LOOKUP / "corpus.jsonl").read_text().splitlines())
    vectors = work / "vectors.npy"  # given vectors: no encoder to load for a dense side nobody asks
    np.save(vectors, np.random.default_rng(0).standard_normal((rows, 8)).astype(np.float32))
    index = work / "index"
    build_index(BuildOptions(corpus=LOOKUP / "corpus.jsonl", out=index, embeddings=vectors, device="cpu"))
    return model, index


async def produce_groups(settings, tracer: Tracer, timeout_s: float) -> None:
    """The rollout app's lifespan, until its producer has put ``MEASURED`` groups in the stream."""
    import redis

    from services.rollout.app import build_app

    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(thread_name_prefix=ROLLOUT_THREADS))
    loop.set_task_factory(tracer.task_factory)
    app = build_app(settings)
    client = redis.Redis.from_url(settings.redis_url)
    deadline = time.monotonic() + timeout_s
    try:
        async with app.router.lifespan_context(app):
            tracer.rollout_open = True
            # Until the measured group's task has finished: its publishing goes on after the XADD.
            while not (MEASURED in tracer.group_tasks and tracer.group_tasks[MEASURED].done()):
                producer = tracer.group_tasks.get(0)
                if producer is not None and producer.done():
                    producer.result()  # its error, if it failed
                    raise RuntimeError("the producer stopped before publishing its groups")
                if time.monotonic() > deadline:
                    status = app.state.producer.status()
                    raise TimeoutError(f"group {MEASURED} not done after {timeout_s:.0f}s: {status}")
                await asyncio.sleep(0.02)
            tracer.rollout_open = False
            published = await asyncio.to_thread(client.xlen, settings.stream)
            if published != MEASURED:
                raise RuntimeError(f"{published} groups in the stream, not {MEASURED}: {app.state.producer.status()}")
    finally:
        tracer.rollout_open = False
        client.close()


def measure(work: Path, timeout_s: float = 120.0) -> Measurement:
    """Run trajectories from the rollout to the trainer's optimizer step, tracing them (module docstring)."""
    started = time.perf_counter()
    tracer = Tracer()
    threading.settrace(tracer)  # every thread started from here on (servers, executors)
    try:
        with contextlib.ExitStack() as stack:
            run(stack, work, tracer, timeout_s)
    finally:
        threading.settrace(None)
        sys.settrace(None)
    return tracer.measurement(time.perf_counter() - started)


def run(stack: contextlib.ExitStack, work: Path, tracer: Tracer, timeout_s: float) -> None:
    from agents.prompts import load_tokenizer
    from services.inference.app import create_inference_app
    from services.inference.config import InferenceSettings
    from services.retriever.app import build_app as retriever_app
    from services.retriever.config import RetrieverSettings
    from services.rollout.config import RolloutSettings
    from services.trainer.config import TrainerSettings
    from services.trainer.loop import Trainer
    from shared.redis_server import RedisServer
    from testing.fake_llm import FakeLLM

    model, index = build_pieces(work)
    redis_server = stack.enter_context(RedisServer())
    retriever = RetrieverSettings.load(RECIPE, index_dir=str(index), host="127.0.0.1", device="cpu")
    retriever_url = stack.enter_context(served(retriever_app(retriever), "retriever"))
    inference = InferenceSettings.load(RECIPE, model=str(model), weights_root=str(work), host="127.0.0.1")
    inference_url = stack.enter_context(served(create_inference_app(inference), "inference"))
    # One group per step, one at a time; the admission window (max_staleness + 1 steps) holds both groups before
    # the trainer takes any, and the second is fresh enough for the second step.
    shared = {"redis_url": redis_server.url, "groups_per_step": 1, "max_staleness": MEASURED - 1}
    rollout = RolloutSettings.load(
        RECIPE, retriever_url=retriever_url, tokenizer=str(model), max_running_groups=1, **shared
    )
    fake = FakeLLM(load_tokenizer(str(model)), scripted_policy(rollout.records()))
    tee = Tee(fake.app(), inference_url)
    rollout = rollout.model_copy(update={"inference_url": stack.enter_context(served(tee, POLICY_THREAD))})

    sys.settrace(tracer)
    asyncio.run(produce_groups(rollout, tracer, timeout_s))
    sys.settrace(None)
    if not tee.statuses or set(tee.statuses) != {200}:
        raise RuntimeError(f"the inference server did not answer the episodes' requests: {tee.statuses}")

    trainer = Trainer(
        TrainerSettings.load(
            RECIPE,
            model=str(model),
            checkpoint_dir=str(work / "checkpoints"),
            weights_dir=str(work / "weights"),
            log_dir=str(work / "logs"),
            max_steps=MEASURED,
            **shared,
        )
    )
    trainer.setup()
    tracer.trainer_thread = threading.get_ident()
    sys.settrace(tracer)
    try:
        state = trainer.run()
    finally:
        sys.settrace(None)
        tracer.trainer_thread = None
    if state.step != MEASURED:
        raise RuntimeError(f"the trainer made {state.step} optimizer steps of {MEASURED} groups, not {MEASURED}")
    if (tracer.steps, tracer.optimizer_steps) != (MEASURED, MEASURED):
        raise RuntimeError(
            f"the trainer's steps were not seen ({tracer.steps}, {tracer.optimizer_steps}): the "
            f"functions that tell them apart moved? ({STEP}, {OPTIMIZER_STEP})"
        )


def check(m: Measurement) -> list[str]:
    """What a sound measurement must have seen: the producer, the agent, the stream, the step, both servers."""
    from services.rollout.config import RolloutSettings
    from services.rollout.producer import Producer
    from services.trainer.step import train_step
    from shared.stream import StreamQueue

    def file_of(obj) -> str:
        return Path(sys.modules[obj.__module__].__file__).relative_to(REPO).as_posix()

    agent = RolloutSettings.load(RECIPE).agent_spec.run
    wanted = {file_of(o) for o in (Producer, agent, StreamQueue, train_step)}
    missing = [f"{f} (not on the path)" for f in sorted(wanted - set(m.path))]
    for server in ("services/inference/", "services/retriever/"):
        if not any(f.startswith(server) for f in m.files("servers")):
            missing.append(f"{server} (no server code ran)")
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testing.trajectory_files", description=__doc__.split("\n")[0])
    parser.add_argument("--max", type=int, default=None, help="exit 1 when more files than this are on the path")
    parser.add_argument("--json", type=Path, default=None, help="also write the measurement to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")  # the index and model builders' progress bars
    with tempfile.TemporaryDirectory(prefix="coda-trajectory-") as work:
        m = measure(Path(work))
    missing = check(m)
    print(render(m))
    if args.json is not None:
        args.json.write_text(json.dumps({**m.as_dict(), "missing": missing}, indent=2) + "\n")
    if missing:
        print(f"the measurement missed what every trajectory runs: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.max is not None and len(m.path) > args.max:
        print(f"{len(m.path)} files on the path: more than --max {args.max}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
