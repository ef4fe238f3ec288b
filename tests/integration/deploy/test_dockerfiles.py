"""The Dockerfile.<service> images, read as text: sources exist, dependencies come before code, one extra,
a non-root user, a healthcheck, the ports of the settings classes, a ``python -m services.<name>`` entrypoint."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import sys
import tomllib

import pytest

from tests.integration.deploy.project import (
    ROOT,
    SERVICES,
    dockerfile,
    dockerfile_instructions,
    settings_class,
    subcommands,
)


def _ignored(path: str) -> bool:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = path.rstrip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(p, pattern.removeprefix("**/")) or fnmatch.fnmatch(p, pattern)
        for p in prefixes
        for pattern in patterns
    )


def _copies(service: str) -> list[list[str]]:
    out = []
    for instruction, args in dockerfile_instructions(dockerfile(service)):
        if instruction == "COPY":
            words = [w for w in args.split() if not w.startswith("--")]
            out.append(words[:-1])
    return out


def _requirements_module():
    spec = importlib.util.spec_from_file_location("docker_requirements", ROOT / "deploy/docker/requirements.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("service", SERVICES)
def test_every_copy_source_exists_and_is_in_the_build_context(service):
    copies = _copies(service)
    assert copies, f"Dockerfile.{service} copies nothing"
    for sources in copies:
        for source in sources:
            assert (ROOT / source).exists(), f"Dockerfile.{service}: COPY {source} does not exist"
            assert not _ignored(source), f"Dockerfile.{service}: COPY {source} is excluded by .dockerignore"


@pytest.mark.parametrize("service", SERVICES)
def test_dependencies_are_installed_before_the_code_is_copied(service):
    instructions = dockerfile_instructions(dockerfile(service))
    install = next(i for i, (ins, args) in enumerate(instructions) if ins == "RUN" and "pip install" in args)
    code = [
        i for i, (ins, args) in enumerate(instructions) if ins == "COPY" and ("shared/" in args or "services/" in args)
    ]
    assert code and install < min(code), f"Dockerfile.{service} copies code before installing dependencies"
    before = [args for ins, args in instructions[:install] if ins == "COPY"]
    assert all(("pyproject.toml" in a or "requirements.py" in a) for a in before), before
    # Only this service's extra (plus the base dependencies) is installed.
    run = instructions[install][1]
    assert 'requirements.py $(echo "$EXTRAS"' in run, run
    args = [args for ins, args in instructions[:install] if ins == "ARG"]
    assert f"EXTRAS={service}" in args, f"Dockerfile.{service} should default to its own extra, has {args}"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert service in extras, f"pyproject.toml has no [{service}] extra"


@pytest.mark.parametrize("service", SERVICES)
def test_runs_as_non_root_with_healthcheck_entrypoint_and_the_settings_port(service):
    instructions = dockerfile_instructions(dockerfile(service))
    kinds = [ins for ins, _ in instructions]
    users = [args for ins, args in instructions if ins == "USER"]
    assert users and users[-1] not in ("root", "0"), f"Dockerfile.{service} runs as root"
    assert kinds.index("USER") > max(i for i, k in enumerate(kinds) if k == "RUN"), "USER before the last RUN"
    health = [args for ins, args in instructions if ins == "HEALTHCHECK"]
    assert health and f'"deploy/docker/healthcheck.py", "{service}"' in health[0]
    entry = json.loads(next(args for ins, args in instructions if ins == "ENTRYPOINT"))
    assert entry == ["python", "-m", f"services.{service}"]
    cmd = json.loads(next(args for ins, args in instructions if ins == "CMD"))
    assert cmd[0] in subcommands(service), f"Dockerfile.{service}: CMD {cmd} is not a subcommand"
    env = " ".join(args for ins, args in instructions if ins == "ENV")
    assert f"CODA_{service.upper()}_HOST=0.0.0.0" in env, "the service must listen on all interfaces"
    exposed = [int(args) for ins, args in instructions if ins == "EXPOSE"]
    cls = settings_class(service)
    assert exposed == [cls.model_fields["port"].default]
    assert "host" in cls.model_fields


def test_default_ports_are_distinct():
    """Services started by hand on one host with their defaults must not collide (rollout and trainer once did)."""
    ports = {service: settings_class(service).model_fields["port"].default for service in SERVICES}
    assert len(set(ports.values())) == len(ports), ports


def test_requirements_expand_self_references_and_reject_unknown_extras():
    module = _requirements_module()
    pyproject = {
        "project": {
            "name": "coda-stack",
            "dependencies": ["a"],
            "optional-dependencies": {"x": ["b", "a"], "y": ["c"], "all": ["coda-stack[x,y]"]},
        }
    }
    assert module.requirements(pyproject, ["all"]) == ["a", "b", "c"]
    assert module.requirements(pyproject, ["y"]) == ["a", "c"]
    with pytest.raises(KeyError, match="no extra 'z'"):
        module.requirements(pyproject, ["z"])
    real = tomllib.loads((ROOT / "pyproject.toml").read_text())
    trainer = module.requirements(real, ["trainer"])
    assert any(r.startswith("torch") for r in trainer) and not any(r.startswith("faiss") for r in trainer)


def test_dockerignore_keeps_the_context_small_but_not_the_code():
    for excluded in (".git", ".venv", "runs", "tests", "services/__pycache__"):
        assert _ignored(excluded), excluded
    for kept in ("shared", "services/retriever", "configs", "data", "pyproject.toml", "deploy/docker"):
        assert not _ignored(kept), kept


def _healthcheck_module():
    spec = importlib.util.spec_from_file_location("docker_healthcheck", ROOT / "deploy/docker/healthcheck.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_healthcheck_script_polls_the_port_the_settings_resolve_to(monkeypatch):
    """The images' HEALTHCHECK: 0 against a live house app on the service's (env-overridden) port, 1 when
    nothing listens there; it finds every service's settings class."""
    import threading
    import time

    import uvicorn

    from shared.http import create_app
    from shared.redis_server import free_port

    module = _healthcheck_module()
    port = free_port()
    app, _ = create_app("deploytest")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.time() + 10
        while not server.started and time.time() < deadline:
            time.sleep(0.02)
        for service in SERVICES:
            prefix = settings_class(service).model_config["env_prefix"]
            monkeypatch.delenv("CODA_RECIPE", raising=False)
            monkeypatch.setenv(f"{prefix}PORT", str(port))
            assert module.main([service]) == 0, service
            monkeypatch.setenv(f"{prefix}PORT", str(free_port()))
            assert module.main([service]) == 1, service
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert module.main([]) == 2
