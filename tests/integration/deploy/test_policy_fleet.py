"""deploy/policy_fleet.py: N vLLM policy servers for the gpu profile, one GPU each, all known to the rollout.

The override is merged into the compose file as compose merges it (mappings key by key, a service's
``ports`` and ``command`` replaced here because the override's servers are new services), then checked like the
compose file itself: the compose-spec schema, distinct GPUs and host ports, and the rollout's URLs naming
running policy servers through a real ``RolloutSettings``.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

from deploy.policy_fleet import fleet_override, main
from services.rollout.config import RolloutSettings
from tests.integration.deploy.project import ROOT, env_example, interpolate, raw_compose, service_environment
from tests.integration.deploy.test_compose import _validate


def merged(override: dict) -> dict:
    out = copy.deepcopy(raw_compose())
    for name, service in override["services"].items():
        if name in out["services"]:
            out["services"][name]["environment"].update(service["environment"])
        else:
            out["services"][name] = service
    return out


def test_three_servers_have_their_own_gpus_and_ports_and_the_rollout_samples_from_all(tmp_path, monkeypatch):
    override = fleet_override(3, raw_compose())
    services = merged(override)["services"]
    policies = ["policy", "policy-2", "policy-3"]
    env = env_example()
    gpus = [
        interpolate(d["device_ids"][0], env)
        for name in policies
        for d in services[name]["deploy"]["resources"]["reservations"]["devices"]
    ]
    assert gpus == ["0", "1", "2"]
    host_ports = [interpolate(services[name]["ports"][0], env).split(":")[1] for name in policies]
    assert len(set(host_ports)) == 3, host_ports
    for name in policies[1:]:  # the same server as `policy`: model, LoRA flags, worker extension, API key
        assert services[name]["image"] == services["policy"]["image"]
        assert services[name]["profiles"] == ["gpu"]
        flags = {a.split("=")[0] for a in services[name]["command"]}
        assert flags == {a.split("=")[0] for a in services["policy"]["command"]}
        assert service_environment(services[name]) == service_environment(services["policy"])
    urls = service_environment(services["rollout"])["CODA_ROLLOUT_INFERENCE_URLS"]
    monkeypatch.setenv("CODA_ROLLOUT_INFERENCE_URLS", urls)
    settings = RolloutSettings()
    assert settings.inference_urls == ["http://policy-2:8002", "http://policy-3:8002"]
    rendered = tmp_path / "fleet.yml"
    rendered.write_text(yaml.safe_dump(merged(override)))
    result = _validate(rendered)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_command_line_writes_the_override_and_refuses_a_fleet_of_one(capsys):
    assert main(["2"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert set(doc["services"]) == {"policy-2", "rollout"}
    with pytest.raises(SystemExit):
        main(["1"])
    assert "at least 2" in capsys.readouterr().err
    script = subprocess.run(
        [sys.executable, "deploy/policy_fleet.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert script.returncode == 0 and "one GPU each" in script.stdout
