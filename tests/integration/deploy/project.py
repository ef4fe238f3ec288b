"""What the deploy tests read: the compose file (with compose's variable interpolation), the Dockerfiles,
the services' settings classes, and the recipes. No Docker engine is involved anywhere.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from shared.settings import ServiceSettings

ROOT = Path(__file__).resolve().parents[3]
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
# The services that have a folder, a Dockerfile and a settings class.
SERVICES = ("retriever", "inference", "rollout", "searcher", "trainer")
# The image that is no service: Dockerfile.stack (compose's prepare job) runs the launcher.
PACKAGES = {"stack": "launcher"}


def package(name: str) -> str:
    """The package an image's name stands for: ``services.<name>``, or the launcher for ``stack``."""
    return PACKAGES.get(name, f"services.{name}")


# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}, ${VAR:+alt}; $$ is a literal $.
_VAR = re.compile(
    r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])((?:[^{}]|\{[^{}]*\})*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)"
)


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's interpolation of one string; a missing ``${VAR:?msg}`` raises ``KeyError(msg)``."""

    def replace(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(4)
        op, arg = match.group(2), match.group(3) or ""
        current = env.get(name)
        empty = current is None or (op is not None and op.startswith(":") and current == "")
        if op in ("-", ":-"):
            return interpolate(arg, env) if empty else current
        if op in ("?", ":?"):
            if empty:
                raise KeyError(f"{name}: {arg}")
            return current
        if op in ("+", ":+"):
            return "" if empty else interpolate(arg, env)
        return current or ""

    return _VAR.sub(replace, value)


def variables(value: str) -> list[tuple[str, str | None, str]]:
    """The ``(name, operator, argument)`` of every variable reference in ``value`` (``$$`` excluded)."""
    out = []
    for match in _VAR.finditer(value):
        if match.group(0) != "$$":
            out.append((match.group(1) or match.group(4), match.group(2), match.group(3) or ""))
    return out


def walk_strings(node: Any):
    """Every string (keys and values) in a parsed YAML document."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from walk_strings(key)
            yield from walk_strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk_strings(item)


def _interpolate_tree(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, dict):
        return {k: _interpolate_tree(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate_tree(v, env) for v in node]
    return node


def env_example() -> dict[str, str]:
    """``.env.example`` as a dict (what a user starts from)."""
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


@functools.cache
def raw_compose() -> dict[str, Any]:
    """The compose file as YAML (anchors and ``<<`` merges resolved, variables not yet)."""
    return yaml.safe_load(COMPOSE_FILE.read_text())


def compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The compose file with variables interpolated from ``env`` (default: ``.env.example``)."""
    return _interpolate_tree(raw_compose(), env_example() if env is None else env)


def service_environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def container_ports(service: dict[str, Any]) -> list[int]:
    """Container-side ports of a service's ``ports`` (short syntax ``[ip:]host:container``)."""
    out = []
    for entry in service.get("ports", []):
        out.append(int(str(entry["target"] if isinstance(entry, dict) else entry).rsplit(":", 1)[-1]))
    return out


def hostnames(name: str, service: dict[str, Any]) -> set[str]:
    """The names a service answers to inside the compose network: its own and its network aliases."""
    names = {name}
    for net in (service.get("networks") or {}).values():
        names.update((net or {}).get("aliases", []))
    return names


def built_from(service: dict[str, Any]) -> str | None:
    """The service folder whose Dockerfile builds this image (None for upstream images)."""
    build = service.get("build")
    return build["dockerfile"].removeprefix("Dockerfile.") if build else None


def listen_port(service: dict[str, Any]) -> int:
    """The port a service listens on: its settings default, or vLLM's --port."""
    folder = built_from(service)
    if folder:
        return settings_class(folder).model_fields["port"].default
    flags = [a for a in service.get("command", []) if isinstance(a, str) and a.startswith("--port=")]
    return int(flags[0].split("=", 1)[1]) if flags else container_ports(service)[0]


def settings_class(service: str) -> type[ServiceSettings]:
    """The one ServiceSettings subclass in ``services/<service>/config.py`` (``launcher/config.py`` for stack)."""
    module = importlib.import_module(f"{package(service)}.config")
    classes = [
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, ServiceSettings) and obj is not ServiceSettings and obj.__module__ == module.__name__
    ]
    assert len(classes) == 1, f"{module.__name__} should define one settings class, has {classes}"
    return classes[0]


def env_prefix(cls: type[ServiceSettings]) -> str:
    return cls.model_config.get("env_prefix", "")


def dockerfile(service: str) -> Path:
    return ROOT / f"Dockerfile.{service}"


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def dockerfile_env(path: Path) -> dict[str, str]:
    """What the Dockerfile's ``ENV`` instructions set (``KEY=value ...``, or the old ``KEY value``)."""
    env: dict[str, str] = {}
    for instruction, args in dockerfile_instructions(path):
        if instruction != "ENV":
            continue
        words = shlex.split(args)
        if words and "=" not in words[0]:
            env[words[0]] = " ".join(words[1:])
            continue
        env.update(word.split("=", 1) for word in words)
    return env


def _cli_tree(service: str):
    import ast

    return ast.parse((ROOT / package(service).replace(".", "/") / "__main__.py").read_text())


def subcommands(service: str) -> set[str]:
    """The ``add_parser("name")`` subcommands of ``python -m services.<service>`` (``launcher`` for stack; read,
    not run)."""
    import ast

    names = set()
    for node in ast.walk(_cli_tree(service)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_parser"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.add(node.args[0].value)
    return names


def cli_flags(service: str) -> set[str]:
    """Every ``--flag`` the CLI declares, plus one per settings field (``Settings.add_arguments``)."""
    import ast

    flags = set()
    for node in ast.walk(_cli_tree(service)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            flags.update(a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--"))
    flags.update("--" + name.replace("_", "-") for name in settings_class(service).model_fields)
    flags.add("--recipe")
    return flags
