"""Nobody else can drive the compose stack: its ports listen on this host only unless ``BIND_ADDRESS`` opens
them, every service of ours gets the control token from .env, and ``make .env`` writes a random one."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from shared.auth import CONTROL_TOKEN_ENV
from tests.integration.deploy.project import (
    ENV_EXAMPLE,
    ROOT,
    built_from,
    compose,
    env_example,
    raw_compose,
    service_environment,
)

BIND = "${BIND_ADDRESS:-127.0.0.1}:"
REQUIRED = {"REDIS_PASSWORD": "x", "GRAFANA_PASSWORD": "x", CONTROL_TOKEN_ENV: "t0ken"}


def _published(services: dict) -> list[tuple[str, str]]:
    return [(name, str(entry)) for name, service in services.items() for entry in service.get("ports", [])]


def test_every_published_port_binds_to_bind_address_with_loopback_default():
    published = _published(raw_compose()["services"])
    assert len(published) >= 9  # redis, retriever, both policies, searcher, rollout, both trainers, prometheus, grafana
    for name, entry in published:
        assert entry.startswith(BIND), f"{name} publishes {entry} on every host interface: prefix it with {BIND}"


@pytest.mark.parametrize(
    ("env", "address"),
    [(REQUIRED, "127.0.0.1"), (None, "127.0.0.1"), ({**REQUIRED, "BIND_ADDRESS": "0.0.0.0"}, "0.0.0.0")],
    ids=["defaults", "env-example", "opened"],
)
def test_the_host_address_is_loopback_unless_bind_address_opens_it(env, address):
    for name, entry in _published(compose(env)["services"]):
        assert entry.split(":")[0] == address, f"{name}: {entry}"
        assert len(entry.split(":")) == 3, f"{name}: {entry} is not ADDRESS:HOST:CONTAINER"


def test_rollout_ports_for_replicas_still_parse():
    """ROLLOUT_PORTS=:8004 (one free host port per replica) renders as 127.0.0.1::8004, compose's form."""
    rollout = compose({**REQUIRED, "ROLLOUT_PORTS": ":8004"})["services"]["rollout"]
    assert rollout["ports"] == ["127.0.0.1::8004"]


def test_every_service_of_ours_and_the_policy_vllm_get_the_control_token():
    services = compose(REQUIRED)["services"]
    ours = [name for name, service in services.items() if built_from(service)]
    assert {"prepare", "retriever", "policy-cpu", "searcher", "rollout", "trainer", "trainer-cpu"} <= set(ours)
    for name in ours:
        assert service_environment(services[name]).get(CONTROL_TOKEN_ENV) == "t0ken", name
    # vLLM's own key (it guards /v1, LoRA loading included): the same token, which our clients send.
    assert service_environment(services["policy"])["VLLM_API_KEY"] == "t0ken"


def test_a_missing_token_is_a_clear_error_not_an_open_server():
    with pytest.raises(KeyError, match=CONTROL_TOKEN_ENV):
        compose({"REDIS_PASSWORD": "x", "GRAFANA_PASSWORD": "x"})
    with pytest.raises(KeyError, match=CONTROL_TOKEN_ENV):
        compose({**REQUIRED, CONTROL_TOKEN_ENV: ""})
    assert CONTROL_TOKEN_ENV in env_example() and "BIND_ADDRESS" in env_example()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_env_writes_a_fresh_random_token_and_passwords(tmp_path):
    tokens = []
    for run in ("a", "b"):
        folder = tmp_path / run
        folder.mkdir()
        shutil.copy(ROOT / "Makefile", folder / "Makefile")
        shutil.copy(ENV_EXAMPLE, folder / ".env.example")
        subprocess.run(["make", "-s", ".env"], cwd=folder, check=True, capture_output=True, timeout=60)
        written = dict(
            line.split("=", 1) for line in (folder / ".env").read_text().splitlines() if "=" in line and line[0] != "#"
        )
        for key in ("REDIS_PASSWORD", "GRAFANA_PASSWORD", CONTROL_TOKEN_ENV):
            assert written[key] != env_example()[key] and written[key].isalnum(), key
        assert len(written[CONTROL_TOKEN_ENV]) == 64
        assert (folder / ".env").stat().st_mode & 0o077 == 0  # the secrets are the owner's only
        tokens.append(written[CONTROL_TOKEN_ENV])
    assert tokens[0] != tokens[1]
