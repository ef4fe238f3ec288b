"""Fitness test of the layout: each service's code imports no other service, and no product code imports what
the service images do not carry.

``services/`` holds exactly the five containers' code; each image copies ``shared/``, ``agents/`` and its own
``services/<name>/`` only (the Dockerfiles' COPY lines), so a module of ``services/<a>/`` that imports
``services/<b>/`` breaks image ``a`` at run time, and one that imports the launcher, ``tools/``, ``testing/``,
``tests/`` or ``bench/`` too. Every module is parsed (nothing imported): ``import``, ``from … import``
(relative ones resolved), imports inside functions (a lazy import still runs in the container) and
``importlib.import_module("…")`` with a literal name all count.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVICES = ("inference", "retriever", "rollout", "searcher", "trainer")
# Top-level packages no service image copies (Dockerfile.stack, the launcher's image, is no service).
NOT_IN_SERVICE_IMAGES = ("launcher", "tools", "testing", "tests", "bench")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every module ``path`` imports, ``from a import b`` giving ``a.b`` too."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names if alias.name != "*"]
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id == "import_module")
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def violations(root: Path = REPO) -> list[str]:
    """One line per import across service folders or out of the service images, under ``root/services``."""
    problems = []
    for service in sorted(p.name for p in (root / "services").iterdir() if p.is_dir() and p.name != "__pycache__"):
        for path in sorted((root / "services" / service).rglob("*.py")):
            where = path.relative_to(root).as_posix()
            for line, name in imported_names(path, root):
                parts = name.split(".")
                if parts[0] == "services" and len(parts) > 1 and parts[1] != service:
                    problems.append(f"{where}:{line}: services/{service}/ imports services/{parts[1]}/ ({name})")
                elif parts[0] in NOT_IN_SERVICE_IMAGES:
                    problems.append(f"{where}:{line}: services/{service}/ imports {parts[0]}/ ({name})")
    return sorted(set(problems))


def library_violations(root: Path = REPO) -> list[str]:
    """``shared/`` and ``agents/`` go into every service image: they import no service, nor what images lack."""
    problems = []
    for library in ("shared", "agents"):
        for path in sorted((root / library).rglob("*.py")):
            where = path.relative_to(root).as_posix()
            for line, name in imported_names(path, root):
                top = name.split(".")[0]
                if top == "services" or top in NOT_IN_SERVICE_IMAGES:
                    problems.append(f"{where}:{line}: {library}/ imports {top}/ ({name})")
    return sorted(set(problems))


def test_services_holds_exactly_the_five_containers():
    folders = {p.name for p in (REPO / "services").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(SERVICES), f"services/ should hold the five containers' code only: {sorted(folders)}"
    for service in SERVICES:
        assert (REPO / f"Dockerfile.{service}").is_file(), f"services/{service}/ has no Dockerfile.{service}"


def test_no_service_imports_another_or_what_its_image_lacks():
    problems = violations()
    assert not problems, "move shared code to shared/ (or agents/):\n  " + "\n  ".join(problems)


def test_the_libraries_every_image_copies_import_no_service():
    problems = library_violations()
    assert not problems, "\n  ".join(["shared/ and agents/ are copied into every image:", *problems])


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in {"services/__init__.py": "", **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_check_catches_a_planted_violation_of_each_kind(tmp_path):
    root = _tree(
        tmp_path,
        {
            "services/trainer/__init__.py": "",
            "services/trainer/ok.py": "from services.trainer.loop import x\nfrom shared.log import get_logger\n",
            "services/trainer/loop.py": "import json\n\n\ndef f():\n    from services.rollout.config import X\n",
            "services/trainer/rel.py": "from ..rollout import weights\n",
            "services/trainer/dyn.py": "import importlib\nimportlib.import_module('services.searcher.app')\n",
            "services/trainer/tool.py": "from tools.make_sft import build\n",
            "services/trainer/pkg.py": "from services import retriever\n",
            "services/rollout/__init__.py": "",
            "services/rollout/config.py": "from . import weights\nimport services.rollout.weights\n",
            "shared/__init__.py": "",
            "shared/ok.py": "from shared.log import get_logger\n",
            "shared/bad.py": "def f():\n    import services.trainer.metrics\n",
            "agents/__init__.py": "",
            "agents/bad.py": "from launcher import LocalStack\n",
        },
    )
    found = violations(root)
    assert found == [
        "services/trainer/dyn.py:2: services/trainer/ imports services/searcher/ (services.searcher.app)",
        "services/trainer/loop.py:5: services/trainer/ imports services/rollout/ (services.rollout.config)",
        "services/trainer/loop.py:5: services/trainer/ imports services/rollout/ (services.rollout.config.X)",
        "services/trainer/pkg.py:1: services/trainer/ imports services/retriever/ (services.retriever)",
        "services/trainer/rel.py:1: services/trainer/ imports services/rollout/ (services.rollout)",
        "services/trainer/rel.py:1: services/trainer/ imports services/rollout/ (services.rollout.weights)",
        "services/trainer/tool.py:1: services/trainer/ imports tools/ (tools.make_sft)",
        "services/trainer/tool.py:1: services/trainer/ imports tools/ (tools.make_sft.build)",
    ]
    assert library_violations(root) == [
        "agents/bad.py:1: agents/ imports launcher/ (launcher)",
        "agents/bad.py:1: agents/ imports launcher/ (launcher.LocalStack)",
        "shared/bad.py:2: shared/ imports services/ (services.trainer.metrics)",
    ]
