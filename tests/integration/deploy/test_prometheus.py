"""deploy/prometheus/prometheus.yml against the compose file: every service that serves /metrics is scraped where
it listens, and the rollout job finds every replica of `up --scale rollout=N`, each once, with the DNS of Docker
Compose and of podman-compose (whose container names differ, and whose answer for the service name may lack
replicas)."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.integration.deploy.project import ROOT, built_from, compose, hostnames, listen_port

PROMETHEUS = ROOT / "deploy/prometheus/prometheus.yml"
SCALED = "rollout"  # the service the README scales (`--scale rollout=N`)
MAX_REPLICAS = 8  # replicas Prometheus must find even where the service name is not answered with all of them
# A replica's container name: Docker Compose's, and podman-compose's (its default separator).
CONTAINER_NAMES = {"docker": "{project}-{service}-{n}", "podman": "{project}_{service}_{n}"}
UPSTREAM_METRICS = ("vllm/vllm-openai:", "prom/prometheus:")  # upstream images that serve /metrics


def _jobs() -> dict[str, dict]:
    return {job["job_name"]: job for job in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]}


def _names(job: dict) -> list[tuple[str, int]]:
    """Every (host, port) a job scrapes or looks up: static targets and DNS names."""
    out = [tuple(t.rsplit(":", 1)) for c in job.get("static_configs", []) for t in c["targets"]]
    out += [(name, c["port"]) for c in job.get("dns_sd_configs", []) for name in c["names"]]
    return [(host, int(port)) for host, port in out]


def _services_of(host: str, job: str, services: dict) -> set[str]:
    """The compose services a name stands for: a service name or alias (an alias may be shared by the services of
    different profiles: policy, trainer), a replica's container name, or (in Prometheus's own job) localhost. A
    trailing dot (a rooted name) names the same host."""
    bare = host.rstrip(".")
    if bare == "localhost":
        return {job} & set(services)
    found = {name for name, service in services.items() if bare in hostnames(name, service)}
    match = re.fullmatch(rf"{re.escape(compose()['name'])}([-_])([a-z0-9-]+)\1\d+", bare)
    if match and match.group(2) in services:
        found.add(match.group(2))
    return found


def _serves_metrics(service: dict) -> bool:
    """Ours (a long-running service whose app is shared.http's, which serves /metrics), vLLM and Prometheus."""
    folder = built_from(service)
    if folder:
        app = ROOT / "services" / folder / "app.py"
        return service.get("restart") != "no" and app.is_file() and "create_app(" in app.read_text()
    return service.get("image", "").startswith(UPSTREAM_METRICS)


def test_every_target_is_a_compose_service_where_it_listens():
    services = compose()["services"]
    for job_name, job in _jobs().items():
        for host, port in _names(job):
            targets = _services_of(host, job_name, services)
            assert targets, f"job {job_name} scrapes {host}, which compose does not define"
            for target in targets:
                assert port == listen_port(services[target]), f"job {job_name}: {target} listens elsewhere than {port}"


def test_every_service_that_serves_metrics_is_scraped():
    services = compose()["services"]
    scraped = set().union(
        *(_services_of(host, name, services) for name, job in _jobs().items() for host, _ in _names(job))
    )
    expected = {name for name, service in services.items() if _serves_metrics(service)}
    assert {"retriever", "searcher", "rollout", "trainer", "trainer-cpu", "policy", "policy-cpu"} <= expected
    assert expected <= scraped, f"never scraped: {sorted(expected - scraped)}"
    assert scraped <= expected, f"scraped without /metrics: {sorted(scraped - expected)}"


def _answer(name: str, engine: str, replicas: int, service_name_answer: str) -> set[int]:
    """The replicas a DNS query for ``name`` returns in the compose network. ``service_name_answer``: what the
    engine's DNS answers Prometheus for the service name (all replicas, only one, or nothing)."""
    bare = name.rstrip(".")
    services = compose()["services"]
    if bare in hostnames(SCALED, services[SCALED]):
        return {"all": set(range(1, replicas + 1)), "one": {1}, "none": set()}[service_name_answer]
    pattern = CONTAINER_NAMES[engine]
    found = {
        n for n in range(1, replicas + 1) if pattern.format(project=compose()["name"], service=SCALED, n=n) == bare
    }
    return found


@pytest.mark.parametrize("engine", sorted(CONTAINER_NAMES))
@pytest.mark.parametrize("service_name_answer", ["all", "one", "none"])
@pytest.mark.parametrize("replicas", [1, 2, MAX_REPLICAS])
def test_the_rollout_job_finds_every_replica(engine, service_name_answer, replicas):
    job = _jobs()[SCALED]
    names = [name for config in job["dns_sd_configs"] for name in config["names"]]
    found = set().union(*(_answer(name, engine, replicas, service_name_answer) for name in names))
    assert found == set(range(1, replicas + 1))
    # Through rooted names alone too: Prometheus's DNS client takes the first search domain that answers NOERROR,
    # records or not, so a name left to the search list can come back empty where the resolver finds it.
    rooted = set().union(*(_answer(n, engine, replicas, service_name_answer) for n in names if n.endswith(".")))
    assert rooted == set(range(1, replicas + 1))


def test_a_rollout_replica_found_under_several_names_is_scraped_once():
    # Prometheus merges targets of one job with the same labels and address. An address by name (a static
    # "rollout:8004") or a label made from the name looked up (__meta_dns_name) would make two targets of one
    # replica, and every sum over the job would count it twice.
    job = _jobs()[SCALED]
    assert not job.get("static_configs"), "a static target duplicates the replica DNS finds by address"
    assert all(config["type"] == "A" for config in job["dns_sd_configs"])
    assert "__meta_dns_name" not in yaml.safe_dump(job.get("relabel_configs", []))
