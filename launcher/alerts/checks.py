"""The rules' math for ``make train``: one pure function per rule, from what was observed to None (quiet) or
a line of the numbers that made it fire. ``rules.RULES`` pairs each with its PromQL twin."""

from __future__ import annotations

import math
import statistics

from launcher.alerts.observed import Observed, finite, mean, median, rolling_means
from launcher.alerts.settings import AlertSettings

Detail = str | None
LEARNED_FROM = 3  # EntropyCollapse: the first RL steps whose mean reward is where the run started


def trainer_stalled(o: Observed, s: AlertSettings) -> Detail:
    """No step for ``stall_factor`` × the median step time (and at least ``stall_min_s``)."""
    times, seconds = o.values("time"), o.values("step_seconds")
    if not times or not seconds:
        return None  # no step yet: its median is unknown
    since = o.now - max(times[-1], o.started)
    limit = max(s.stall_factor * median(seconds), s.stall_min_s)
    if since <= limit:
        return None
    return f"no step for {since:.0f}s (median step {median(seconds):.1f}s, limit {limit:.0f}s)"


def rollout_stalled(o: Observed, s: AlertSettings) -> Detail:
    """No group published for ``rollout_stall_s`` while the trainer's queue is empty (it waits for groups)."""
    if not o.scrapes or (o.last("queue_lag") or 0) > 0:
        return None
    last_new = o.scrapes[0].time
    previous = None
    for scrape in o.scrapes:
        published = scrape.total("coda_rollout_groups_total", outcome="published")
        if published is not None and previous is not None and published > previous:
            last_new = scrape.time
        previous = published if published is not None else previous
    since = o.now - max(last_new, o.started)
    return f"no group published for {since:.0f}s, the trainer's queue empty" if since > s.rollout_stall_s else None


def _held(o: Observed, name: str, bad, seconds: float) -> list[str]:
    """Servers (label ``server``) for which ``bad(scrape, server)`` held in every scrape of the last ``seconds``
    (the first scrape at least that old included)."""
    if not o.scrapes or o.now - o.scrapes[0].time < seconds:
        return []
    recent = [sc for sc in o.scrapes if sc.time >= o.now - seconds]
    older = [sc for sc in o.scrapes if sc.time < o.now - seconds]
    window = ([older[-1]] if older else []) + recent
    servers = {dict(key).get("server", "") for key in o.scrapes[-1].series(name)}
    return sorted(srv for srv in servers if all(bad(sc, srv) for sc in window))


def server_down(o: Observed, s: AlertSettings) -> Detail:
    """A policy server the rollout has seen down for ``server_down_s``."""
    down = _held(
        o,
        "coda_rollout_server_up",
        lambda sc, srv: sc.total("coda_rollout_server_up", server=srv) == 0,
        s.server_down_s,
    )
    return f"down for over {s.server_down_s:.0f}s: {', '.join(down)}" if down else None


def server_behind(o: Observed, s: AlertSettings) -> Detail:
    """A policy server serving a version ``server_lag_versions`` or more behind the live one, for
    ``server_behind_s``."""

    def behind(sc, srv) -> bool:
        live = max(sc.series("coda_policy_version").values(), default=None)
        served = sc.total("coda_rollout_server_version", server=srv)
        return live is not None and served is not None and served >= 0 and live - served >= s.server_lag_versions

    late = _held(o, "coda_rollout_server_version", behind, s.server_behind_s)
    return f"{s.server_lag_versions}+ versions behind the live one: {', '.join(late)}" if late else None


def stale_rollouts(o: Observed, s: AlertSettings) -> Detail:
    """Over the last ``window_steps`` RL steps, the share of samples dropped for staleness."""
    rows = [r for r in o.records if r.get("groups", 0)][-s.window_steps :]
    dropped = sum(float(r.get("dropped_stale_step", 0)) for r in rows)
    used = sum(float(r.get("rl_sequences", 0)) + float(r.get("skipped_zero_advantage", 0)) for r in rows)
    if dropped == 0 or dropped / (dropped + used) <= s.stale_share:
        return None
    return f"{dropped / (dropped + used):.0%} of samples dropped as stale over the last {len(rows)} steps"


def mismatch_spike(o: Observed, s: AlertSettings) -> Detail:
    """Sampler/trainer mismatch: KL (k3) averaged over ``window_steps`` above ``mismatch_kl`` and
    ``mismatch_spike_factor`` × its median, or the last mean importance weight far from 1. Averaged: one
    version of staleness at tiny-cpu's learning rate gives 0.01-0.2 and single steps up to ~1 on a healthy run."""
    kls, weight = [v for v in o.values("mismatch_kl_k3") if finite(v)], o.last("is_weight_mean")
    recent = kls[-s.window_steps :]
    if kls and mean(recent) > max(s.mismatch_kl, s.mismatch_spike_factor * median(kls)):
        return f"mismatch KL {mean(recent):.3g} over the last {len(recent)} steps, median {median(kls):.3g}"
    if weight is not None and abs(weight - 1) > s.is_weight_deviation:
        return f"mean importance weight {weight:.3f}, more than {s.is_weight_deviation:g} from 1"
    return None


def entropy_collapse(o: Observed, s: AlertSettings) -> Detail:
    """The policy's entropy below ``entropy_fraction`` of its peak and below ``entropy_floor``, while the reward
    (averaged over ``window_steps``) is below ``entropy_solved_reward`` (a solved task may stop exploring) and
    less than ``entropy_learned_gain`` above the mean of the first ``LEARNED_FROM`` RL steps (a policy that grew
    sure as its reward climbed learned)."""
    values = [v for v in o.values("rl_entropy") if finite(v)]
    if len(values) < 2:
        return None
    raw = [v for v in o.values("reward_mean") if finite(v)]
    rewards = rolling_means(raw, s.window_steps)
    if rewards and rewards[-1] >= s.entropy_solved_reward:
        return None
    # Learned: the recent reward (up to window_steps) above where RL started (its first steps, near the peak
    # entropy), not the lowest full window, which for a run that climbs in its first steps already holds the climb.
    if raw and mean(raw[-s.window_steps :]) - mean(raw[:LEARNED_FROM]) >= s.entropy_learned_gain:
        return None
    now, peak = values[-1], max(values)
    if now < s.entropy_fraction * peak and now < s.entropy_floor:
        return f"entropy {now:.3f} nats, {now / peak:.0%} of its peak {peak:.3f}"
    return None


def reward_drop(o: Observed, s: AlertSettings) -> Detail:
    """The reward, averaged over ``window_steps``, fallen from its peak by more than ``reward_drop_fraction`` of
    its range, more than ``reward_drop_min``, and more than ``reward_drop_z`` standard errors of a difference of
    two such means (from the spread of every step's reward): the peak of many noisy windows sits above a plateau
    by chance, and a long run at one would otherwise be told it unlearns."""
    rewards = [v for v in o.values("reward_mean") if finite(v)]
    smooth = rolling_means(rewards, s.window_steps)
    if len(smooth) < 2:
        return None
    peak, low, now = max(smooth), min(smooth), smooth[-1]
    noise = s.reward_drop_z * statistics.pstdev(rewards) * math.sqrt(2 / s.window_steps)
    if peak - now > max(s.reward_drop_fraction * (peak - low), s.reward_drop_min, noise):
        return f"reward {now:.3f} (mean of {s.window_steps} steps), down from its peak {peak:.3f}"
    return None


def signal_share(record: dict) -> float:
    """A step's share of groups with a learning signal: its ``signal_share``, or from its group counts (a log
    written before the trainer logged the share)."""
    if isinstance(record.get("signal_share"), int | float):
        return float(record["signal_share"])
    return 1.0 - float(record.get("zero_variance_groups", 0)) / float(record["groups"])


def no_learning_signal(o: Observed, s: AlertSettings) -> Detail:
    """Over the last ``no_signal_steps`` steps with groups, the share of groups whose rewards were all equal
    (1 − ``signal_share``, weighted by the steps' groups) above ``no_signal_share``, while the mean reward of
    those steps is below ``no_signal_solved_reward`` (a solved task's groups are all 1). Steps that also
    trained on demonstrations count: a run whose RL part learns nothing is not saved by them (a policy trained
    from scratch, rewarded after tens of such steps, sets a larger ``no_signal_steps``)."""
    rows = [r for r in o.records if r.get("groups", 0)][-s.no_signal_steps :]
    if len(rows) < s.no_signal_steps:
        return None
    groups = sum(float(r["groups"]) for r in rows)
    share = sum(float(r["groups"]) * (1.0 - signal_share(r)) for r in rows) / groups
    rewards = [float(r["reward_mean"]) for r in rows if isinstance(r.get("reward_mean"), int | float)]
    if share <= s.no_signal_share or (rewards and mean(rewards) >= s.no_signal_solved_reward):
        return None
    reward = f", mean reward {mean(rewards):.3f}" if rewards else ""
    return f"{share:.0%} of groups had equal rewards (advantage 0) over the last {len(rows)} steps{reward}"


def sft_loss_rising(o: Observed, s: AlertSettings) -> Detail:
    """The demonstrations' loss (``sft_loss``), averaged over ``sft_rise_steps`` steps, above ``sft_rise_factor``
    × its lowest such average and more than ``sft_rise_min`` above it: training on the demonstrations makes
    the policy worse at them (the warm start's learning rate too high, a diverging run)."""
    smooth = rolling_means([v for v in o.values("sft_loss") if finite(v)], s.sft_rise_steps)
    if len(smooth) < 2:
        return None
    low, now = min(smooth), smooth[-1]
    if now > s.sft_rise_factor * low and now - low > s.sft_rise_min:
        return f"demonstration loss {now:.3g} (mean of {s.sft_rise_steps} steps), up from its lowest {low:.3g}"
    return None


def clip_fraction_high(o: Observed, s: AlertSettings) -> Detail:
    """The clipped share of tokens, averaged over the last ``window_steps`` steps."""
    values = [v for v in o.values("clip_fraction") if finite(v)][-s.window_steps :]
    if not values or mean(values) <= s.clip_fraction:
        return None
    return f"clip fraction {mean(values):.2f} over the last {len(values)} steps"


def non_finite(o: Observed, s: AlertSettings) -> Detail:
    """A step whose loss or gradient norm is not finite. The trainer's log leaves NaN out (observe.Observer), so
    a record without ``grad_norm`` counts too."""
    for r in reversed(o.records[-s.window_steps :]):
        bad = [k for k in ("loss", "grad_norm") if isinstance(r.get(k), int | float) and not math.isfinite(r[k])]
        if "grad_norm" not in r and "step" in r:
            bad.append("grad_norm (NaN, left out of the log)")
        if bad:
            return f"step {r.get('step', '?')}: non-finite {', '.join(bad)}"
    return None
