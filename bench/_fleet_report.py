"""The arithmetic and the report of ``bench/fleet.py``, apart from the runs so that it can be unit-tested.

Scaling: episodes/s against N servers is judged against linear scaling from one server, eps(N) / (N · eps(1)),
and against what N servers can serve at most (N · slots / service time). Overhead: the fleet's and the old
single-URL path's episodes/s, measured in alternating order (A B B A …); a ratio per repetition, and the ratio
of the means. Publish: the time until every server of the fleet serves a new weight version.
"""

from __future__ import annotations

import statistics

SCALING_TARGET = 0.90  # eps(16) ≥ 90% of linear (issue 28 item 7)
OVERHEAD_TARGET = 0.05  # the fleet at N = 1 at most 5% fewer episodes/s than the single-URL path
CPU_BOUND_CORES = 0.85  # the rollout's one event loop this busy: it, not the servers, sets the pace
HOST_BUSY = 0.90  # the host's cores this busy: the machine, not the servers, sets the pace


def with_scaling(rows: list[dict], capacity_per_server: float) -> list[dict]:
    """Each ``{"servers": N, "eps": ...}`` row with ``linear`` (N · eps(1)), ``efficiency`` (eps / linear) and
    ``ideal`` (N · one server's capacity); the row with N = 1 must be there."""
    one = next(r["eps"] for r in rows if r["servers"] == 1)
    out = []
    for row in rows:
        n = row["servers"]
        linear = n * one
        out.append(
            {
                **row,
                "linear": linear,
                "efficiency": row["eps"] / linear if linear else float("nan"),
                "ideal": n * capacity_per_server,
                "of_ideal": row["eps"] / (n * capacity_per_server) if capacity_per_server else float("nan"),
            }
        )
    return out


def cpu_limited(row: dict) -> bool:
    """True when the rollout process or the host was near its CPU limit while the row was measured."""
    return row.get("rollout_cores", 0.0) >= CPU_BOUND_CORES or row.get("host_busy", 0.0) >= HOST_BUSY


def abba(reps: int) -> list[str]:
    """The order of ``reps`` repetitions of two variants: A B, B A, A B, … (a drift hits both alike)."""
    order: list[str] = []
    for k in range(reps):
        order += ["A", "B"] if k % 2 == 0 else ["B", "A"]
    return order


def overhead(runs: list[dict], a: str = "fleet", b: str = "single") -> dict:
    """Runs ``{"variant", "eps"}`` in measured order → the ratio a/b of the means, one ratio per repetition
    (the k-th run of ``a`` against the k-th run of ``b``) and the overhead 1 − ratio."""
    eps_a = [r["eps"] for r in runs if r["variant"] == a]
    eps_b = [r["eps"] for r in runs if r["variant"] == b]
    pairs = [_ratio(x, y) for x, y in zip(eps_a, eps_b, strict=True)]
    ratio = _ratio(statistics.fmean(eps_a), statistics.fmean(eps_b))
    return {
        "ratio": ratio,
        "overhead": 1.0 - ratio,
        "pairs": pairs,
        "pair_min": min(pairs),
        "pair_max": max(pairs),
        "met": 1.0 - ratio <= OVERHEAD_TARGET,
    }


def _ratio(x: float, y: float) -> float:
    return x / y if y else float("nan")  # no episodes at all in a window: no ratio (and no crash at the end)


def spread(values: list[float]) -> dict:
    """Median, min and max (publish times: a handful of samples, no mean to be pulled by one slow one)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def verdict(met: bool) -> str:
    return "**met**" if met else "**not met**"


def _f(x: float, digits: int = 1) -> str:
    return f"{x:.{digits}f}"


def scaling_section(rows: list[dict], cfg: dict) -> list[str]:
    last = rows[-1]
    lines = [
        "## 1. Episodes/s against the number of policy servers",
        "",
        f"Each server: `--max-num-seqs {cfg['slots']}` (requests served at once, like vLLM's), "
        f"{cfg['tokens']} generated tokens per episode × {_f(cfg['token_ms'])} ms per token = "
        f"{_f(cfg['service_s'] * 1000, 0)} ms per episode, so at most {_f(cfg['capacity'], 2)} episodes/s per "
        f"server. The rollout keeps {cfg['in_flight']} episodes in flight at every N "
        f"({cfg['groups']} groups × {cfg['n_samples']} samples = {cfg['factor']:g} × {cfg['max_n']} servers × "
        f"{cfg['slots']} slots), so even the largest fleet has a queue at every server. "
        f"Window: {_f(cfg['window_s'], 2)} s (whole service times: episodes that start together end together) "
        f"after {_f(cfg['warmup_s'])} s of warm-up; in-flight episodes are drained before the next N.",
        "",
        "| servers | episodes in window | episodes/s | linear (N · eps(1)) | **% of linear** | % of server "
        "capacity | median episode latency (s) | rollout CPU (cores) | servers' CPU (cores) | redis CPU (cores) | "
        "host CPU busy | failed groups |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['servers']} | {r['episodes']} | {_f(r['eps'])} | {_f(r['linear'])} | "
            f"**{_f(100 * r['efficiency'])}%** | {_f(100 * r['of_ideal'])}% | {_f(r['latency_s'], 2)} | "
            f"{_f(r['rollout_cores'], 2)} | {_f(r['server_cores'], 2)} | {_f(r['redis_cores'], 2)} | "
            f"{_f(100 * r['host_busy'], 0)}% | {r['failed']} |"
        )
    met = last["efficiency"] >= SCALING_TARGET
    lines += [
        "",
        f"Target: ≥ {100 * SCALING_TARGET:.0f}% of linear at {last['servers']} servers: {verdict(met)} "
        f"({_f(100 * last['efficiency'])}%).",
    ]
    limited = [r["servers"] for r in rows if cpu_limited(r)]
    if limited:
        lines.append(
            f"CPU-limited at N = {', '.join(map(str, limited))}: the rollout process used ≥ "
            f"{CPU_BOUND_CORES:g} of its one core, or the host was ≥ {100 * HOST_BUSY:.0f}% busy; there the "
            "rate says what this host's CPU allows, not what the fleet's balancing allows."
        )
    else:
        lines.append(
            f"No level was CPU-limited (rollout < {CPU_BOUND_CORES:g} core, host < {100 * HOST_BUSY:.0f}% busy): "
            "the rate is set by the servers and by how the fleet spreads episodes over them."
        )
    return [*lines, ""]


def publish_section(rows: list[dict], cfg: dict) -> list[str]:
    lines = [
        "## 2. Weight publish: new version → every server serves it",
        "",
        f"LoRA events on the weights stream, as the trainer publishes them: the version key and the event (a "
        f"fake adapter folder; each fake server takes {_f(cfg['load_ms'], 0)} ms per adapter load). The "
        "rollout's `WeightFollower` reads the event and wakes the `FleetWatch`, which loads the adapter into "
        "every server (the trainer loads none); the clock stops when the fleet's view (what `pick` uses) has every server at the "
        "new version. Idle fleet (no episodes running), default `fleet_probe_s` "
        f"({_f(cfg['probe_s'])} s). Versions {_f(cfg['gap_s'])} s apart (more than the watch's "
        f"{_f(cfg['retry_s'], 0)} s between two loads into one server)"
        + (
            f"; then one version {_f(cfg['fast_gap_s'])} s after the previous one (`back-to-back`)."
            if cfg["fast_gap_s"]
            else "."
        ),
        "",
        "| servers | versions | event → all serve, median (ms) | min – max (ms) | trainer's own load → all serve, "
        "median (ms) | loads by the rollout |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        e, t = r["event"], r["total"]
        lines.append(
            f"| {r['servers']}{' (back-to-back)' if r.get('fast') else ''} | {e['n']} | {_f(1000 * e['median'])} | "
            f"{_f(1000 * e['min'])} – {_f(1000 * e['max'])} | {_f(1000 * t['median'])} | {r['loads']} |"
        )
    slow = [r for r in rows if r.get("fast") and r["servers"] > 1 and r["event"]["median"] > 1.0]
    if slow:
        lines += [
            "",
            f"Back-to-back, the servers the rollout loads lag by seconds: the watch starts no load into a server "
            f"within {_f(cfg['retry_s'], 0)} s of the previous one (`SYNC_RETRY_S`, meant to space out retries "
            "of failed loads, also holds after a successful one), and the next periodic probe "
            f"(every {_f(cfg['probe_s'])} s) starts it. Until then those servers get no episodes (they are behind "
            "the live version): a trainer publishing more often than that runs the fleet on fewer servers.",
        ]
    return [*lines, ""]


def overhead_section(modes: list[dict]) -> list[str]:
    lines = [
        "## 3. Fleet overhead at N = 1 against the single-URL path",
        "",
        "Same fake server, same settings and prompts; `fleet`: the producer with `FleetRunner` and a running "
        "`FleetWatch` (as `services/rollout/app.py` wires it); `single`: the `Producer` built without `fleet=` "
        "(what eval and direct construction use). Repetitions alternate A B B A …; ratio = fleet ÷ single "
        "episodes/s.",
        "",
        "| mode | order | fleet episodes/s (each run) | single episodes/s (each run) | fleet CPU/episode (ms) | "
        "single CPU/episode (ms) | rollout CPU (cores, mean) | failed groups | ratio of means | "
        "per-repetition ratios | **overhead** | target ≤ 5% |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in modes:
        o, runs = m["summary"], m["runs"]
        each = {v: ", ".join(_f(r["eps"]) for r in runs if r["variant"] == v) for v in ("fleet", "single")}
        cpu = {
            v: statistics.fmean(r["cpu_ms_per_episode"] for r in runs if r["variant"] == v) for v in ("fleet", "single")
        }
        lines.append(
            f"| {m['name']} | {' '.join(r['variant'][0].upper() for r in runs)} | {each['fleet']} | "
            f"{each['single']} | {_f(cpu['fleet'], 2)} | {_f(cpu['single'], 2)} | "
            f"{_f(statistics.fmean(r['rollout_cores'] for r in runs), 2)} | {sum(r.get('failed', 0) for r in runs)} | "
            f"{_f(o['ratio'], 3)} | "
            f"{', '.join(_f(p, 3) for p in o['pairs'])} | **{_f(100 * o['overhead'])}%** | {verdict(o['met'])} |"
        )
    lines.append("")
    for m in modes:
        lines.append(f"- `{m['name']}`: {m['describe']}")
    cpu_mode = next((m for m in modes if m["name"] == "cpu-bound"), None)
    if cpu_mode and statistics.fmean(r["rollout_cores"] for r in cpu_mode["runs"]) < CPU_BOUND_CORES:
        lines += [
            "",
            f"The `cpu-bound` runs used less than {CPU_BOUND_CORES:g} of the rollout's core: the host did not give "
            "it a whole core (shared host) or something else set the pace, so their ratio is not the fleet's "
            "CPU overhead; the CPU/episode columns are the better measure there.",
        ]
    return [*lines, ""]
