"""The pure parts of the soak (``bench/soak.py``): the seeded fault schedule, RSS growth, recovery times, the
alerts each fault may fire, and the report. No processes here: ``tests/unit/bench/test_soak_parts.py``."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

# Each service in turn; "policy" is one server of the fleet (the second one when there are two).
TARGETS = ("trainer", "rollout", "policy", "retriever", "redis")
KINDS = ("kill", "stop")  # SIGKILL (then restarted) or SIGSTOP (then SIGCONT)
STOP_S = (5.0, 30.0)  # how long a SIGSTOP lasts, drawn
RSS_BAR = 0.10  # RSS growth over the last two thirds of the run

# The alerts a fault of a target may fire (docs/alerts.md): an alert outside these is unexpected.
EXPECTED = {
    "trainer": {"TrainerNotStepping", "PolicyServerBehind", "StaleRollouts"},
    "rollout": {"RolloutNotProducing", "TrainerNotStepping"},
    "policy": {"PolicyServerDown", "PolicyServerBehind", "RolloutNotProducing", "TrainerNotStepping"},
    "retriever": {"RolloutNotProducing", "TrainerNotStepping"},
    "redis": {"TrainerNotStepping", "RolloutNotProducing", "StaleRollouts", "PolicyServerBehind"},
}


@dataclass
class Fault:
    at_s: float  # seconds after training started
    target: str
    kind: str  # kill | stop
    hold_s: float  # kill: seconds down before the restart; stop: seconds stopped
    # filled in by the run
    started: float | None = None  # wall time the signal was sent
    ended: float | None = None  # wall time the service was back (restarted healthy, or SIGCONT)
    recovery_s: float | None = None  # from ``started`` to the next completed trainer step
    alerts: list[str] = field(default_factory=list)
    error: str = ""


def schedule(seed: int, minutes: float, faults: int | None = None, targets=TARGETS) -> list[Fault]:
    """``faults`` faults (default: one per 6 minutes, at least one per target) at seeded random times in the
    middle of the run (after a fifth of it, and leaving a fifth after the last for recovery), the targets in
    turn from a seeded start, each a SIGKILL or a SIGSTOP."""
    rng = random.Random(seed)
    n = faults if faults is not None else max(len(targets), int(minutes / 6))
    span = minutes * 60
    lo, hi = 0.2 * span, 0.8 * span
    # One slot each, a random time inside it: faults never overlap in order, each has room to recover.
    slot = (hi - lo) / max(n, 1)
    first = rng.randrange(len(targets))
    out = []
    for i in range(n):
        kind = rng.choice(KINDS)
        hold = rng.uniform(*STOP_S) if kind == "stop" else rng.uniform(1.0, 5.0)
        at = lo + i * slot + rng.uniform(0.0, 0.5 * slot)
        out.append(Fault(round(at, 1), targets[(first + i) % len(targets)], kind, round(hold, 1)))
    return out


def rss_growth(samples: list[tuple[float, int]], skip: float = 1 / 3) -> float | None:
    """Growth of RSS over the last ``1 - skip`` of the run: the mean of the last tenth of the samples against
    the mean of the first tenth after ``skip`` of the time span, as a fraction (None: too few samples)."""
    if len(samples) < 4:
        return None
    t0, t1 = samples[0][0], samples[-1][0]
    late = [s for s in samples if s[0] >= t0 + skip * (t1 - t0)]
    if len(late) < 2:
        return None
    k = max(1, len(late) // 10)
    first = sum(r for _, r in late[:k]) / k
    last = sum(r for _, r in late[-k:]) / k
    return last / first - 1 if first > 0 else None


def recovery_s(started: float, step_times: list[float]) -> float | None:
    """Seconds from a fault to the next completed step (None: none after it)."""
    after = [t for t in step_times if t > started]
    return min(after) - started if after else None


def attribute_alerts(faults: list[Fault], fired: list[tuple[float, str]], window_s: float) -> list[tuple[float, str]]:
    """Give each fired alert (wall time, rule name) to the faults whose expected alerts include it and during
    or within ``window_s`` after which it fired; returns those no fault explains (unexpected)."""
    unexpected = []
    for when, name in fired:
        owners = [
            f
            for f in faults
            if f.started is not None
            and name in EXPECTED.get(f.target, set())
            and f.started <= when <= (f.ended or f.started) + window_s
        ]
        for f in owners:
            f.alerts.append(name)
        if not owners:
            unexpected.append((when, name))
    return unexpected


def render(result: dict) -> str:
    """``bench/results/soak.md`` from the soak's result (the same dict as ``soak.json``)."""
    r = result
    ok = lambda b: "yes" if b else "**NO**"  # noqa: E731
    lines = [
        "# Soak with chaos",
        "",
        f"`{r['command']}`  ",
        f"recipe {r['recipe']}, seed {r['seed']}, {r['minutes']} min of training under faults, "
        f"policy servers: {r['policy_servers']}, host: {r['host']}",
        "",
        "## Verdict",
        "",
        "| check | bar | result | pass |",
        "|---|---|---|---|",
    ]
    led = r["ledger"]
    lines.append(
        f"| ledger | every served group trained once, or dropped stale | {led['summary']} | {ok(not led['problems'])} |"
    )
    worst = max((f["recovery_s"] for f in r["faults"] if f["recovery_s"] is not None), default=None)
    unrecovered = [f for f in r["faults"] if f["recovery_s"] is None]
    rec = f"worst {worst:.0f} s" if worst is not None else "none measured"
    if unrecovered:
        rec += f", {len(unrecovered)} without a step after"
    lines.append(
        f"| recovery | next step within {r['recovery_bound_s']:.0f} s | {rec} | "
        f"{ok(not unrecovered and (worst is None or worst <= r['recovery_bound_s']))} |"
    )
    for name, g in sorted(r["rss"].items()):
        shown = "n/a" if g["growth"] is None else f"{100 * g['growth']:+.1f}%"
        note = f" ({g['restarts']} restarts: growth of the last process)" if g["restarts"] else ""
        passed = g["growth"] is None or g["growth"] <= RSS_BAR
        lines.append(f"| RSS {name} | <= +{100 * RSS_BAR:.0f}% over the last 2/3 | {shown}{note} | {ok(passed)} |")
    lines.append(f"| unexpected alerts | none | {len(r['unexpected_alerts'])} | {ok(not r['unexpected_alerts'])} |")
    lines += [
        "",
        "## Faults",
        "",
        "| # | at (s) | target | kind | held (s) | recovery (s) | alerts |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, f in enumerate(r["faults"], 1):
        rec = "—" if f["recovery_s"] is None else f"{f['recovery_s']:.1f}"
        alerts = ", ".join(sorted(set(f["alerts"]))) or "none"
        err = f" ({f['error']})" if f["error"] else ""
        lines.append(
            f"| {i} | {f['at_s']:.0f} | {f['target']} | {f['kind']} | {f['hold_s']:.1f} | {rec} | {alerts}{err} |"
        )
    lines += ["", "## Alerts fired", ""]
    if r["alerts"]:
        lines += [f"- {a['t']:.0f} s: {a['line']}" for a in r["alerts"]]
    else:
        lines.append("none")
    if r["unexpected_alerts"]:
        lines += ["", "Unexpected (no fault of a target that may fire it, within its window):", ""]
        lines += [f"- {t:.0f} s: {name}" for t, name in r["unexpected_alerts"]]
    lines += [
        "",
        "## RSS (MiB, process group)",
        "",
        "| service | first | at 1/3 | last | max |",
        "|---|---|---|---|---|",
    ]
    for name, g in sorted(r["rss"].items()):
        lines.append(
            f"| {name} | {g['first_mib']:.0f} | {g['third_mib']:.0f} | {g['last_mib']:.0f} | {g['max_mib']:.0f} |"
        )
    lines += ["", "## Ledger", "", led["summary"], ""]
    lines += [f"- {p}" for p in led["problems"]] or ["no problems"]
    ev = r["eval"]
    lines += ["", "## Held-out F1", ""]
    lines.append(f"- this soak (closing eval, {ev['n']} questions): {ev['f1'] if ev['f1'] is not None else 'not run'}")
    lines.append(f"- undisturbed: {r['undisturbed']}")
    if lr := r.get("induced_lr"):
        lines += ["", f"## Induced: learning rate {lr['lr']} (a separate {lr['minutes']} min run, no faults)", ""]
        lines.append(f"{lr['steps']} steps; expected alerts that fired: {', '.join(lr['fired_expected']) or 'none'}")
        lines.append(f"(any of: {', '.join(lr['expected'])})")
        lines += [""] + [f"- {a['t']:.0f} s: {a['line']}" for a in lr["alerts"]]
        lines += [f"- note: {n}" for n in lr["notes"]]
    if r.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in r["notes"]]
    return "\n".join(lines) + "\n"


def fault_dict(f: Fault) -> dict:
    return asdict(f)
