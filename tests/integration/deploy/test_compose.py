"""docker-compose.yml without a Docker engine: the compose-spec schema, then what the schema cannot see —
references, profiles, volumes, variables, env vars against the settings classes, ports, healthchecks."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from shared.auth import CONTROL_TOKEN_ENV
from tests.integration.deploy.project import (
    ROOT,
    SERVICES,
    built_from,
    cli_flags,
    compose,
    container_ports,
    dockerfile,
    dockerfile_env,
    dockerfile_instructions,
    env_example,
    env_prefix,
    hostnames,
    listen_port,
    raw_compose,
    service_environment,
    settings_class,
    subcommands,
    variables,
    walk_strings,
)

CHECK_JSONSCHEMA = Path(sys.executable).with_name("check-jsonschema")
# The profile sets we ship: GPU host, GPU host with a separate searcher model, laptop.
PROFILE_SETS = ({"gpu"}, {"gpu", "searcher-llm"}, {"cpu"})
# CODA_ variables every service reads from the environment, outside its settings class.
ENV_ONLY = ("CODA_RECIPE", "CODA_LOG_FORMAT", "CODA_LOG_LEVEL", CONTROL_TOKEN_ENV)
URL = re.compile(r"^(?:https?|redis)://(?:[^@/]*@)?([a-z0-9-]+):(\d+)")


def _validate(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.compose-spec", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _active(services: dict, profiles: set[str]) -> dict:
    return {name: s for name, s in services.items() if not s.get("profiles") or set(s["profiles"]) & profiles}


def test_compose_file_passes_the_compose_spec_schema(tmp_path):
    # Compose validates after interpolation too: check the file as a user's .env.example renders it.
    rendered = tmp_path / "rendered.yml"
    rendered.write_text(yaml.safe_dump(compose()))
    result = _validate(ROOT / "docker-compose.yml", rendered)
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_rejects_a_broken_file(tmp_path):
    """The validator is not a rubber stamp: a misspelt key and a wrong type fail."""
    bad = tmp_path / "bad.yml"
    bad.write_text("services:\n  redis:\n    image: redis\n    depnds_on: [x]\n    ports: '6379:6379'\n")
    result = _validate(bad)
    assert result.returncode == 1 and "depnds_on" in result.stdout


def test_every_variable_has_a_default_or_a_message_and_required_ones_are_documented():
    documented = env_example()
    used = set()
    for text in walk_strings(raw_compose()):
        for name, op, arg in variables(text):
            used.add(name)
            assert op is not None, f"${{{name}}} has neither a default nor an error message"
            if "?" in op:
                assert arg.strip(), f"${{{name}:?}} needs a message that says what to set"
                assert name in documented, f"required variable {name} is missing from .env.example"
    stale = set(documented) - used
    assert not stale, f".env.example documents variables compose never reads: {sorted(stale)}"
    with pytest.raises(KeyError, match=f"REDIS_PASSWORD|{CONTROL_TOKEN_ENV}"):
        compose({})  # no .env at all: a clear error, not an empty password or an open server


def test_depends_on_targets_exist_wait_for_health_and_respect_profiles():
    services = compose()["services"]
    for name, service in services.items():
        deps = service.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: use the long depends_on form with a condition"
        for target, spec in deps.items():
            assert target in services, f"{name} depends on undefined service {target}"
            condition = spec.get("condition")
            if condition == "service_completed_successfully":
                assert services[target].get("restart") == "no", f"{target} is a one-shot: restart 'no'"
            else:
                assert condition == "service_healthy", f"{name} → {target}: condition {condition!r}"
                assert _has_healthcheck(services[target]), f"{name} waits for {target}, which has no healthcheck"
            # Whenever this service starts, its dependency starts too: podman-compose ≤ 1.6 crashes (KeyError)
            # on a `required: false` dependency on a service outside the active profiles.
            assert "required" not in spec, f"{name} → {target}: `required` is not understood by podman-compose"
            mine, theirs = set(service.get("profiles", [])), set(services[target].get("profiles", []))
            assert not theirs or (mine and mine <= theirs), (
                f"{name} (profiles {sorted(mine) or 'none'}) depends on {target}, which only profiles "
                f"{sorted(theirs)} start"
            )


# (ids avoid the word "gpu": the conftest skips items carrying that keyword on machines without CUDA)
@pytest.mark.parametrize("profiles", PROFILE_SETS, ids=("vllm", "vllm+searcher-llm", "laptop"))
def test_each_profile_set_is_complete_and_every_url_reaches_a_running_service(profiles):
    services = _active(compose()["services"], profiles)
    hosts = {h: name for name, s in services.items() for h in hostnames(name, s)}
    assert "policy" in hosts and "trainer" in hosts, f"profiles {profiles} start no policy or no trainer"
    for name, service in services.items():
        for target, spec in service.get("depends_on", {}).items():
            if spec.get("required", True):
                assert target in services, f"{name} needs {target}, which profiles {profiles} do not start"
        for key, value in service_environment(service).items():
            match = URL.match(value)
            if not match:
                continue
            host, port = match.group(1), int(match.group(2))
            assert host in hosts, f"{name}.{key}={value}: no service {host} under profiles {profiles}"
            target = hosts[host]
            if target != "redis":
                assert port == listen_port(services[target]), f"{name}.{key}: {target} listens elsewhere"


def _has_healthcheck(service: dict) -> bool:
    check = service.get("healthcheck")
    if check is not None:
        return not check.get("disable", False)
    folder = built_from(service)
    return bool(folder) and any(i == "HEALTHCHECK" for i, _ in dockerfile_instructions(dockerfile(folder)))


def test_every_long_running_service_has_a_healthcheck():
    for name, service in compose()["services"].items():
        if service.get("restart") == "no":  # one-shot jobs: they exit, nothing to poll
            continue
        assert _has_healthcheck(service), f"{name} has no healthcheck"
        check = service.get("healthcheck")
        if check:
            assert check["test"][0] in ("CMD", "CMD-SHELL"), name


def test_volumes_are_declared_used_and_bind_sources_exist():
    spec = compose()
    declared = set(spec.get("volumes", {}))
    used = set()
    for name, service in spec["services"].items():
        for mount in service.get("volumes", []):
            source = mount.split(":", 1)[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is not in the repository"
            else:
                assert source in declared, f"{name} uses undeclared volume {source}"
                used.add(source)
    assert declared == used, f"declared but unused volumes: {sorted(declared - used)}"
    for needed in ("indexes", "weights", "checkpoints", "redis-data"):
        assert needed in declared


def _on_writable_volume(path: str, service: dict) -> bool:
    """Whether ``path`` lies in a named volume the service mounts read-write (a restart keeps what is there)."""
    for mount in service.get("volumes", []):
        source, target, *mode = mount.split(":")
        if source.startswith((".", "/")) or "ro" in mode:
            continue
        if path == target or path.startswith(target.rstrip("/") + "/"):
            return True
    return False


def test_the_onnx_export_cache_lies_on_a_volume():
    """The retriever exports its query encoder to ONNX once per model (~5 s) into CODA_ONNX_CACHE; outside a
    volume the export is lost with the container and made again at every restart."""
    checked = []
    for name, service in compose()["services"].items():
        folder = built_from(service)
        if not folder or service.get("restart") == "no":
            continue
        env = {**dockerfile_env(dockerfile(folder)), **service_environment(service)}
        if "CODA_ONNX_CACHE" in env:
            assert _on_writable_volume(env["CODA_ONNX_CACHE"], service), (
                f"{name}: CODA_ONNX_CACHE={env['CODA_ONNX_CACHE']} is not on a writable named volume"
            )
            checked.append(name)
    assert "retriever" in checked  # the service that exports one sets where it goes


def test_weights_are_seen_at_the_same_path_by_the_trainer_and_the_policy():
    """The trainer sends the policy absolute paths of what it wrote: both mount the volume at that path,
    and the CPU server accepts paths under it."""
    services = compose()["services"]
    for trainer, policy in (("trainer", "policy"), ("trainer-cpu", "policy-cpu")):
        weights_dir = service_environment(services[trainer])["CODA_TRAINER_WEIGHTS_DIR"]
        assert weights_dir.startswith("/")
        assert f"weights:{weights_dir}" in services[trainer]["volumes"]
        assert f"weights:{weights_dir}:ro" in services[policy]["volumes"]
        checkpoints = service_environment(services[trainer])["CODA_TRAINER_CHECKPOINT_DIR"]
        assert f"checkpoints:{checkpoints}" in services[trainer]["volumes"]
    assert service_environment(services["policy-cpu"])["CODA_INFERENCE_WEIGHTS_ROOT"] == weights_dir


def test_volume_mount_points_exist_in_our_images_owned_by_the_service_user():
    """A fresh named volume takes the owner of its mount point in the image: those folders must be
    created (and chowned) by the Dockerfile, or the non-root service cannot write to its volume."""
    for name, service in compose()["services"].items():
        folder = built_from(service)
        if not folder:
            continue
        text = " ".join(args for ins, args in dockerfile_instructions(dockerfile(folder)) if ins == "RUN")
        for mount in service.get("volumes", []):
            source, target = mount.split(":")[:2]
            if source.startswith((".", "/")) or mount.endswith(":ro"):
                continue
            assert target in text.split(), f"{name}: {target} is not created in Dockerfile.{folder}"


def test_every_service_gets_the_same_recipe_and_it_exists():
    env = env_example()
    for name, service in compose(env)["services"].items():
        if built_from(service) and service.get("restart") != "no":
            recipe = service_environment(service).get("CODA_RECIPE")
            assert recipe == f"/app/configs/{env['RECIPE']}.toml", f"{name}: CODA_RECIPE={recipe}"
            assert "./configs:/app/configs:ro" in service["volumes"], f"{name} does not mount the recipes"
    defaults = {interpolate_default(t) for t in walk_strings(raw_compose()) if "${RECIPE" in t}
    for recipe in defaults | {env["RECIPE"], "tiny-cpu"}:
        assert (ROOT / "configs" / f"{recipe}.toml").is_file(), f"configs/{recipe}.toml does not exist"


def interpolate_default(text: str) -> str:
    return next(arg for name, _, arg in variables(text) if name == "RECIPE")


def test_coda_env_vars_name_real_settings_fields(monkeypatch):
    """CODA_<SERVICE>_<FIELD>: the prefix is a service's, the field exists, and the value validates."""
    classes = {env_prefix(cls): cls for cls in map(settings_class, SERVICES)}
    checked = 0
    for name, service in compose()["services"].items():
        env = service_environment(service)
        by_class: dict[type, dict[str, str]] = {}
        for key, value in env.items():
            if not key.startswith("CODA_") or key in ENV_ONLY:
                continue
            prefix = next((p for p in classes if key.startswith(p)), None)
            assert prefix is not None, f"{name}: {key} matches no service's env prefix"
            field = key[len(prefix) :].lower().split("__", 1)[0]
            assert field in classes[prefix].model_fields, f"{name}: {key} is not a field of {classes[prefix]}"
            by_class.setdefault(classes[prefix], {})[key] = value
        for cls, values in by_class.items():
            monkeypatch.delenv("CODA_RECIPE", raising=False)
            for key, value in values.items():
                monkeypatch.setenv(key, value)
            cls.load()  # raises on a value of the wrong type
            for key in values:
                monkeypatch.delenv(key)
            checked += len(values)
    assert checked >= 10


def test_ports_agree_with_the_settings_classes():
    services = compose()["services"]
    for name, service in services.items():
        folder = built_from(service)
        if not folder or service.get("restart") == "no":
            continue
        port = listen_port(service)
        assert container_ports(service) == [port], f"{name} publishes {container_ports(service)}, listens on {port}"
    # vLLM takes the CPU server's place under the same URL, so it listens on the inference port.
    assert listen_port(services["policy"]) == settings_class("inference").model_fields["port"].default
    assert container_ports(services["policy"]) == container_ports(services["policy-cpu"])


_INVOCATION = re.compile(r"python -m services\.(\w+) ([\w-]+)((?: +(?:--[\w-]+|\"[^\"]*\"|[^\s|&;\"]+))*)")


def test_commands_are_real_subcommands_and_flags_of_the_service_clis():
    """What compose runs in our images (the command, or a one-shot's shell line) exists in __main__.py."""
    checked = 0
    for name, service in compose()["services"].items():
        folder = built_from(service)
        if not folder:
            continue
        command = service.get("command", [])
        if service.get("entrypoint") is None:
            assert command and command[0] in subcommands(folder), f"{name}: {command} is not a subcommand"
            checked += 1
        for text in command:
            for match in _INVOCATION.finditer(text):
                target, sub, rest = match.groups()
                assert sub in subcommands(target), f"{name}: {target} has no subcommand {sub}"
                for flag in re.findall(r"(?<!\S)--[\w-]+", rest):
                    assert flag in cli_flags(target), f"{name}: {target} {sub} has no flag {flag}"
                checked += 1
        for flag in re.findall(
            r"(?<!\S)--[\w-]+", compose()["services"][name].get("environment", {}).get("INDEX_ARGS", "")
        ):
            assert flag in cli_flags("retriever"), f"INDEX_ARGS uses {flag}, which build does not take"
    assert checked >= 7


def test_vllm_gets_our_worker_extension_lora_flags_and_dev_mode():
    """The policy vLLM can hot-load LoRA adapters and full weights exactly as the trainer calls them."""
    policy = compose()["services"]["policy"]
    flags = dict(
        a.removeprefix("--").split("=", 1) if "=" in a else (a.removeprefix("--"), "") for a in policy["command"]
    )
    module, _, cls = flags["worker-extension-cls"].rpartition(".")
    extension = getattr(importlib.import_module(module), cls)  # shared/ is mounted on the container's path
    assert callable(extension.update_weights_from_path)
    mount = next(m for m in policy["volumes"] if m.startswith("./shared:"))
    assert mount.split(":")[1] == f"{service_environment(policy)['PYTHONPATH']}/shared"
    assert {"enable-lora", "max-loras", "max-lora-rank", "served-model-name", "logprobs-mode"} <= set(flags)
    env = service_environment(policy)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"].lower() in ("1", "true")
    assert env["VLLM_SERVER_DEV_MODE"] == "1"  # /collective_rpc, used for the full-weight reload
    assert flags["served-model-name"] == "policy"
    assert any(d.get("capabilities") == ["gpu"] for d in policy["deploy"]["resources"]["reservations"]["devices"])


def test_compose_launches_vllm_like_the_inference_launch_recipe():
    """deploy/vllm/serve.sh (the inference service's launch recipe) and compose's `policy` agree on the flags,
    the worker extension and the environment."""
    script = (ROOT / "deploy/vllm/serve.sh").read_text()
    script_flags = set(re.findall(r"(?<![\w-])(--[a-z][\w-]+)", script.split("exec vllm serve", 1)[1]))
    policy = compose()["services"]["policy"]
    assert policy["entrypoint"] == ["vllm", "serve"]
    compose_flags = {a.split("=", 1)[0] for a in policy["command"] if a.startswith("--")}
    assert compose_flags == script_flags
    for arg in policy["command"]:
        if arg.startswith(("--worker-extension-cls=", "--logprobs-mode=", "--served-model-name=")):
            flag, value = arg.split("=", 1)
            assert value in script, f"serve.sh launches {flag} differently"
    for name in re.findall(r"^export (VLLM_\w+)=", script, flags=re.M):
        assert name in service_environment(policy), f"compose's policy lacks {name}"
