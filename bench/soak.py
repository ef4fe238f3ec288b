"""Soak with chaos: the local stack (``make train``'s processes) trains a real recipe for ``--minutes`` while a
seeded injector SIGKILLs (then restarts) or SIGSTOPs (then SIGCONTs) each service in turn: trainer, rollout,
one policy server, retriever, Redis (restarted on its port and AOF folder).

Meanwhile it samples each service's RSS (its process group, psutil) every few seconds, notes each completed
trainer step, and records every alert that fires (``make train``'s in-process check, ``monitor_for``). At the
end it stops the rollout and the trainer (SIGTERM: the trainer checkpoints), reads the ledger of groups served
vs trained (``testing.ledger``, the fault suite's definition), runs the closing held-out eval, and writes
``bench/results/soak.md`` + ``soak.json``: the ledger, the time from each fault to the next step, each
service's RSS growth over the last two thirds (bar: 10%), the alerts each fault fired (and any unexpected one),
and the final F1 next to the recipe's recorded undisturbed result.

    .venv/bin/python -m bench.soak --minutes 60 --seed 0 --recipe configs/smol-cpu.toml
    .venv/bin/python -m bench.soak --minutes 2 --faults 2 --out /tmp/soak-quick     # quick mode

Policy fleet: the launcher starts one inference server; the soak starts a second one on its own port
(``--no-fleet``: not) and gives it to the rollout (``CODA_ROLLOUT_INFERENCE_URLS``); "policy" faults hit it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import signal
import sys
import time
from pathlib import Path

import psutil
import redis

from bench._soak_parts import (
    Fault,
    attribute_alerts,
    fault_dict,
    recovery_s,
    render,
    rss_growth,
    schedule,
)

# The launcher, in one place.
from launcher import AlertSettings, LocalStack, Service, StackSettings, Supervisor, monitor_for, read_log
from shared.redis_server import free_port
from testing import ledger

REPO = Path(__file__).resolve().parents[1]
RSS_EVERY_S = 5.0
# Training as the fault suite runs it: a checkpoint per step (a restart resumes where it was killed), no step
# limit (the soak stops the trainer itself).
TRAINING = {"CODA_TRAINER_MAX_STEPS": "0", "CODA_TRAINER_CHECKPOINT_EVERY": "1"}
HIGH_LR = "2e-2"
# What a learning rate far too high may fire (docs/alerts.md): the policy breaks, its reward and entropy fall.
HIGH_LR_ALERTS = {
    "NonFiniteLoss",
    "EntropyCollapse",
    "RewardDrop",
    "DemonstrationLossRising",
    "ClipFractionHigh",
    "NoLearningSignal",
    "SamplerMismatch",
}
UNDISTURBED = {
    "smol-cpu": "lookup F1 0.979 after the 10-step warm start and 240 s of RED (mean of 2 seeds): the ablation's "
    "full RED arm, which is this recipe (bench/results/ablation.md, quoted in docs/benchmarks.md)",
}


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        overrides = {"eval_limit": args.eval_limit} if args.eval_limit is not None else {}
        self.settings = StackSettings.load(args.recipe, **overrides)
        self.stack = LocalStack(args.recipe, self.settings, say=self.say)
        self.log_file = self.stack.run / "trainer" / "train.jsonl"
        self.t0 = time.time()
        self.rss: dict[str, list[tuple[float, int, int]]] = {}  # name → (time, RSS, pid)
        self.step_times: list[float] = []
        self.rows_seen = 0
        self.alerts: list[dict] = []
        self.fired: list[tuple[float, str]] = []
        self.notes: list[str] = []
        self.policy = "inference"
        self.extra_env: dict[str, str] = {}  # over the trainer's and the rollout's environment (the high-LR run)

    def say(self, line: str) -> None:
        print(f"[soak {time.time() - self.t0:6.0f}s] {line}", flush=True)

    def on_alert(self, line: str) -> None:
        self.say(line)
        self.alerts.append({"t": time.time() - self.t0, "line": line})
        if line.startswith("alert ") and " cleared " not in line:
            self.fired.append((time.time(), line.split()[1]))

    # ---------------------------------------------------------------- services
    def service(self, sup: Supervisor, name: str) -> Service:
        return next(s for s in sup.services if s.name == name)

    def target(self, name: str) -> str:
        return self.policy if name == "policy" else name

    def second_server(self, sup: Supervisor) -> str:
        """A second policy server (the launcher's command on another port); returns its URL."""
        port = free_port()
        first = self.service(sup, "inference")
        second = dataclasses.replace(
            first,
            name="inference-2",
            env={**first.env, "CODA_INFERENCE_PORT": str(port)},
            health_url=self.stack.url(port) + "/health",
            proc=None,
            log_path=None,
        )
        sup.start(second)
        return self.stack.url(port)

    # ---------------------------------------------------------------- watching
    def sample(self, sup: Supervisor) -> None:
        now = time.time()
        for s in sup.services:
            if s.proc is None or s.proc.poll() is not None:
                continue
            try:
                root = psutil.Process(s.proc.pid)
                rss = sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
            except psutil.Error:
                continue
            self.rss.setdefault(s.name, []).append((now, rss, s.proc.pid))

    def steps(self) -> None:
        rows = read_log(self.log_file) if self.log_file.is_file() else []
        for row in rows[self.rows_seen :]:
            self.step_times.append(float(row["time"]) if isinstance(row.get("time"), int | float) else time.time())
        self.rows_seen = max(self.rows_seen, len(rows))

    def stream_ids(self) -> set[str]:
        for _ in range(60):
            client = redis.Redis(port=self.stack.ports.redis, socket_timeout=10)
            try:
                return {i.decode() for i, _ in client.xrange(ledger.STREAM)}
            except redis.RedisError:  # just restarted: loading its AOF
                time.sleep(0.5)
            finally:
                client.close()
        raise RuntimeError("Redis did not answer within 30 s")

    # ---------------------------------------------------------------- faults
    def inject(self, sup: Supervisor, fault: Fault) -> tuple[float, object]:
        """Send the fault's signal; returns (when to end it, how)."""
        name = self.target(fault.target)
        service = self.service(sup, name)
        fault.started = time.time()
        self.say(f"fault: {fault.kind} {name} for {fault.hold_s:.0f}s")
        if fault.kind == "stop":
            os.killpg(service.proc.pid, signal.SIGSTOP)
            return fault.started + fault.hold_s, lambda: os.killpg(service.proc.pid, signal.SIGCONT)
        entries = self.stream_ids() if name == "redis" else set()
        os.killpg(service.proc.pid, signal.SIGKILL)
        service.proc.wait(30)
        sup.stop(service)  # already dead: the supervisor only forgets it

        def restart() -> None:
            sup.start(dataclasses.replace(service, proc=None, log_path=None))
            # Redis is restarted on its port and AOF folder: the stream must all be there.
            if name == "redis" and (lost := entries - self.stream_ids()):
                fault.error = f"{len(lost)} stream entries lost by the Redis restart"

        return fault.started + fault.hold_s, restart

    # ---------------------------------------------------------------- the run
    def run(self) -> dict:
        args, stack = self.args, self.stack
        faults = schedule(args.seed, args.minutes, args.faults)
        if args.induced:
            # The induced failures beside the schedule: a policy server stopped mid-run, the trainer paused.
            mid = args.minutes * 30
            faults += [Fault(mid + 7, "policy", "stop", 45.0), Fault(mid + 70, "trainer", "stop", 45.0)]
            faults.sort(key=lambda f: f.at_s)
        for f in faults:
            self.say(f"scheduled: {f.at_s:.0f}s {f.kind} {f.target} ({f.hold_s:.0f}s)")
        eval_n, f1 = 0, None
        led_summary, led_problems = "not read", ["the soak ended before the ledger was read"]
        with Supervisor(stack.run / "logs") as sup:
            sft, _ = stack.prepare_all(sup)
            if args.warm_start:
                stack.warm_start(sup, sft)
            env = {**TRAINING, **self.extra_env}
            if args.fleet:
                url = self.second_server(sup)
                env["CODA_ROLLOUT_INFERENCE_URLS"] = json.dumps([url])
                self.policy = "inference-2"
            trainer, rollout = stack.start_training(sup, sft, **env)
            monitor = monitor_for(stack.recipe, self.log_file, stack.ports.rollout, self.on_alert)
            start = time.time()
            self.say(f"training under faults for {args.minutes} min")
            end, last_rss, todo, pending = start + args.minutes * 60, 0.0, list(faults), None
            try:
                while time.time() < end or pending is not None:
                    now = time.time()
                    if pending is not None and now >= pending[0]:
                        fault, undo = pending[1], pending[2]
                        try:
                            undo()
                        except Exception as e:  # reported, the soak goes on
                            fault.error = f"ending it failed: {e}"
                        fault.ended = time.time()
                        self.say(f"fault over: {fault.target} back after {fault.ended - fault.started:.0f}s")
                        pending = None
                    elif pending is None and todo and now - start >= todo[0].at_s:
                        fault = todo.pop(0)
                        until, undo = self.inject(sup, fault)
                        pending = (until, fault, undo)
                    if now - last_rss >= RSS_EVERY_S:
                        self.sample(sup)
                        last_rss = now
                    self.steps()
                    monitor.tick()
                    sup.check()
                    time.sleep(0.5)
                for f in todo:
                    f.error = "not injected: the run ended first"
                monitor.tick(force=True)
                trainer, rollout = self.service(sup, "trainer"), self.service(sup, "rollout")
                sup.stop(rollout)
                sup.stop(trainer)  # SIGTERM: it checkpoints and acknowledges
                self.steps()
                led = ledger.read_ledger(
                    lambda: redis.Redis(port=stack.ports.redis, socket_timeout=10), stack.run / "checkpoints"
                )
                led_problems = ledger.exact_problems(led)
                led_summary = self.ledger_line(led)
                if self.settings.eval_limit != 0 and not args.no_eval:
                    result = stack.evaluate(sup, "final")
                    eval_n, f1 = result.n, result.metrics.get("f1")
                    self.say(f"final eval: {result.headline()}")
            except (Exception, KeyboardInterrupt) as e:  # the report says what broke
                self.notes.append(f"the soak stopped early: {type(e).__name__}: {str(e)[:400]}")
                self.say(self.notes[-1])
        for f in faults:
            if f.started is not None:
                f.recovery_s = recovery_s(f.started, self.step_times)
        window = 60 * AlertSettings.load(stack.recipe).window_minutes
        unexpected = attribute_alerts(faults, self.fired, window)
        return self.result(faults, unexpected, led_summary, led_problems, eval_n, f1)

    def ledger_line(self, led: ledger.Ledger) -> str:
        rows = read_log(self.log_file)
        stale = sum(int(r.get("dropped_stale_step", 0) or 0) for r in rows)
        served = len(led.delivered - set(led.dead))
        window = "" if led.whole else f" (the checkpoint names the last {len(led.trained)} of {led.groups_trained})"
        return (
            f"{len(led.groups)} groups in the stream, {served} served to the trainer, {len(led.dead)} dead-lettered, "
            f"{len(set(led.trained))} trained{window}, {len(led.pending - led.covered)} pending for the next start; "
            f"{stale} RL samples dropped as stale (the staleness rule, sum of dropped_stale_step)"
        )

    def result(self, faults, unexpected, led_summary, led_problems, eval_n, f1) -> dict:
        rss = {}
        for name, samples in self.rss.items():
            # A restarted service: the growth of its last process, over that process's own samples.
            last_pid = [(t, r) for t, r, pid in samples if pid == samples[-1][2]]
            restarts = len({pid for _, _, pid in samples}) - 1
            mib = [r / 2**20 for _, r, _ in samples]
            third = samples[0][0] + (samples[-1][0] - samples[0][0]) / 3
            rss[name] = {
                "growth": rss_growth(last_pid),
                "restarts": restarts,
                "first_mib": mib[0],
                "third_mib": next((r / 2**20 for t, r, _ in samples if t >= third), mib[-1]),
                "last_mib": mib[-1],
                "max_mib": max(mib),
                "samples": [(round(t - self.t0, 1), r, pid) for t, r, pid in samples],
            }
        name = Path(self.args.recipe).stem
        return {
            "command": "python -m bench.soak " + shlex.join(sys.argv[1:]),
            "recipe": self.args.recipe,
            "seed": self.args.seed,
            "minutes": self.args.minutes,
            "policy_servers": 2 if self.args.fleet else 1,
            "host": f"{platform.node()} {os.cpu_count()} CPUs",
            "run": str(self.stack.run),
            "recovery_bound_s": self.args.recovery_bound,
            "faults": [
                {**fault_dict(f), "started": f.started and f.started - self.t0, "ended": f.ended and f.ended - self.t0}
                for f in faults
            ],
            "alerts": self.alerts,
            "unexpected_alerts": [(t - self.t0, n) for t, n in unexpected],
            "rss": rss,
            "steps": len(self.step_times),
            "ledger": {"summary": led_summary, "problems": led_problems},
            "eval": {"n": eval_n, "f1": f1},
            "undisturbed": UNDISTURBED.get(name, f"no recorded undisturbed result of {name}"),
            "notes": self.notes,
        }


def high_lr(args: argparse.Namespace) -> dict:
    """A separate short run (its own run folder, Redis and servers) with the learning rate far too high and no
    faults: which alerts say so, and when."""
    lr_args = argparse.Namespace(
        **{**vars(args), "minutes": args.lr_minutes, "faults": 0, "induced": False, "fleet": False, "no_eval": True}
    )
    soak = Soak(lr_args)
    soak.extra_env = {"CODA_TRAINER_LR": HIGH_LR}
    soak.say(f"induced: a separate run of {args.lr_minutes} min with CODA_TRAINER_LR={HIGH_LR}")
    # In the environment of every process, as a user's `CODA_TRAINER_LR=2e-2 make train` would set it: the warm
    # start's trainer too (the training's env alone left the warm start at the recipe's rate).
    os.environ["CODA_TRAINER_LR"] = HIGH_LR
    try:
        result = soak.run()
    finally:
        os.environ.pop("CODA_TRAINER_LR", None)
    fired = sorted({a["line"].split()[1] for a in result["alerts"] if " cleared " not in a["line"]})
    return {
        "lr": HIGH_LR,
        "minutes": args.lr_minutes,
        "steps": result["steps"],
        "run": result["run"],
        "alerts": result["alerts"],
        "expected": sorted(HIGH_LR_ALERTS),
        "fired_expected": [a for a in fired if a in HIGH_LR_ALERTS],
        "notes": result["notes"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recipe", default="configs/smol-cpu.toml")
    ap.add_argument("--faults", type=int, default=None, help="how many (default: one per 6 min, >= 5)")
    ap.add_argument("--no-fleet", dest="fleet", action="store_false", help="one policy server, not two")
    ap.add_argument("--no-warm-start", dest="warm_start", action="store_false", help="skip the recipe's warm start")
    ap.add_argument(
        "--induced",
        action="store_true",
        help="the induced failures too: a policy server stopped and the trainer paused mid-run, then a separate "
        "run of --lr-minutes with the learning rate far too high (CODA_TRAINER_LR=2e-2)",
    )
    ap.add_argument("--lr-minutes", type=float, default=5.0, help="the high-LR run's minutes of training")
    ap.add_argument("--eval-limit", type=int, default=None, help="held-out questions of the closing eval")
    ap.add_argument("--no-eval", action="store_true", help="no closing eval")
    ap.add_argument("--recovery-bound", type=float, default=180.0, help="seconds from a fault to the next step")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "soak"), help="writes OUT.md and OUT.json")
    args = ap.parse_args(argv)
    result = Soak(args).run()
    if args.induced:
        result["induced_lr"] = high_lr(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    text = render(result)
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
