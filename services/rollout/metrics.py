"""The rollout's Prometheus metrics (``coda_rollout_*``): throughput, turns, tokens, rewards, failures,
admission waits, staleness and pauses for dependency outages. Registered on the app's registry; the producer
updates them."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from shared.metrics import LATENCY_BUCKETS, POLICY_VERSION

REWARD_BUCKETS = (-3, -2, -1, -0.5, 0, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4)


class RolloutMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        self.episodes = Counter("coda_rollout_episodes_total", "Episodes finished", ["recipe"], registry=r)
        self.groups = Counter(
            "coda_rollout_groups_total",
            "Groups by outcome: published; failed; dropped (its prompt given up after repeated failures); "
            "no_signal (scored but not published under drop_flat_groups: all its rewards were equal)",
            ["outcome"],
            registry=r,
        )
        self.failures = Counter("coda_rollout_failures_total", "Failed groups by cause", ["cause"], registry=r)
        self.episode_seconds = Histogram(
            "coda_rollout_episode_seconds", "Episode wall time", buckets=LATENCY_BUCKETS, registry=r
        )
        self.turns = Histogram(
            "coda_rollout_turns_per_episode",
            "Policy turns per episode (all roles)",
            buckets=(1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30),
            registry=r,
        )
        self.tokens = Counter("coda_rollout_tokens_total", "Tokens in published samples", ["kind"], registry=r)
        self.reward = Histogram("coda_rollout_reward", "Episode reward", buckets=REWARD_BUCKETS, registry=r)
        self.component = Gauge(
            "coda_rollout_reward_component", "Mean reward component of the last group", ["component"], registry=r
        )
        self.admission_wait = Histogram(
            "coda_rollout_admission_wait_seconds", "Wait for an admission slot", buckets=LATENCY_BUCKETS, registry=r
        )
        self.staleness = Histogram(
            "coda_rollout_staleness_versions",
            "Live version at publish minus the oldest version of the group's tokens",
            buckets=(0, 1, 2, 3, 4, 6, 8, 16),
            registry=r,
        )
        self.running = Gauge("coda_rollout_running_groups", "Groups in flight", registry=r)
        self.queued = Gauge("coda_rollout_queued_prompts", "Prompts waiting (including re-queued)", registry=r)
        self.waiting = Gauge(
            "coda_rollout_waiting_for_dependency",
            "1 while new groups are paused until this dependency answers again",
            ["dependency"],
            registry=r,
        )
        self.outages = Counter(
            "coda_rollout_dependency_outages_total", "Outages that paused new groups", ["dependency"], registry=r
        )
        self.paused_seconds = Counter(
            "coda_rollout_paused_seconds_total", "Seconds new groups were paused for dependency outages", registry=r
        )
        self.version = Gauge(POLICY_VERSION, "Policy version the rollout samples with", ["service"], registry=r)


class FleetCollector:
    """Per policy server of the fleet (label ``server``, its URL), read from ``status()`` at each scrape (the
    fleet's own counters: nothing on the episode path updates a metric): up, weight version served (-1 while
    unprobed), episodes running there now, and episodes given and failed there so far."""

    def __init__(self, status: Callable[[], dict]) -> None:
        self.status = status  # ``Fleet.status``

    def collect(self) -> Iterator[Metric]:
        servers = self.status()["servers"]
        up = GaugeMetricFamily("coda_rollout_server_up", "1 while the policy server answers", labels=["server"])
        version = GaugeMetricFamily(
            "coda_rollout_server_version", "Weight version the policy server serves (-1: not probed)", labels=["server"]
        )
        running = GaugeMetricFamily(
            "coda_rollout_server_outstanding_episodes", "Episodes running on the policy server", labels=["server"]
        )
        episodes = CounterMetricFamily(
            "coda_rollout_server_episodes", "Episodes given to the policy server (restarts included)", labels=["server"]
        )
        failures = CounterMetricFamily(
            "coda_rollout_server_failures", "Episodes that failed on the policy server", labels=["server"]
        )
        for url, s in servers.items():
            up.add_metric([url], float(s["up"]))
            version.add_metric([url], -1.0 if s["version"] is None else float(s["version"]))
            running.add_metric([url], float(s["outstanding"]))
            episodes.add_metric([url], float(s["episodes"]))
            failures.add_metric([url], float(s["failures"]))
        yield from (up, version, running, episodes, failures)
