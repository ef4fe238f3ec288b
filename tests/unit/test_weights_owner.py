"""Weights flow one way: no module outside the rollout loads weights into a policy server (docs/architecture.md, "The pipeline").

An AST scan of every project module (services/, shared/, agents/, launcher/, tools/, bench/, deploy/,
testing/) for a call of the inference client's weight-loading methods (``load_lora``, ``unload_lora``, ``reload_weights``) or a call
that names a weight-loading route. Only ``services/rollout/`` may make one (its ``loader`` is the one way in,
used by the fleet watch and by the tools that load weights by hand). Excepted: the client that defines the
methods, the inference server and its vLLM worker extension (they serve the routes), and the fake and the
fixture recorder of the server's API (they are, or record, the server side of those routes). tests/ may load
weights to set a scene.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("services", "shared", "agents", "launcher", "tools", "bench", "deploy", "testing")
OWNER = "services/rollout/"
METHODS = frozenset({"load_lora", "unload_lora", "reload_weights"})
ROUTES = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "update_weights_from_path")
EXCEPTED = {
    "shared/inference_client.py": "defines the methods",
    "shared/inference_sync.py": "defines their blocking twins",
    "services/inference/": "the server: it serves the routes",
    "shared/vllm_worker_extension.py": "runs inside vLLM's workers: the route's other end",
    "testing/fake_llm.py": "a fake server: it serves the routes",
    "deploy/vllm/record_fixtures.py": "records the server API's own answers to these routes",
}


def weight_loads(source: str) -> list[tuple[int, str]]:
    """(line, what) of every call in ``source`` that loads weights into a server."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in METHODS:
            found.append((node.lineno, f"{name}()"))
            continue
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            for const in ast.walk(arg):
                if isinstance(const, ast.Constant) and isinstance(const.value, str) and const.value in ROUTES:
                    found.append((node.lineno, repr(const.value)))
    return found


def owned_elsewhere(rel: str) -> bool:
    """Whether a module at ``rel`` (repository-relative) is one that must not load weights."""
    return not rel.startswith(OWNER) and not any(rel.startswith(prefix) for prefix in EXCEPTED)


def offenders(root: Path = REPO) -> list[str]:
    out = []
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if owned_elsewhere(rel):
                out += [f"{rel}:{line}: {what}" for line, what in weight_loads(path.read_text())]
    return out


def test_only_the_rollout_loads_weights_into_servers():
    bad = offenders()
    assert not bad, (
        "weights are loaded into a server outside services/rollout/ (go through services.rollout.loader):\n"
        + "\n".join(bad)
    )


def test_the_scan_sees_a_planted_load(tmp_path):
    """The scan is not vacuous: each kind of load, planted in a module outside the rollout, is found."""
    (tmp_path / "services" / "trainer").mkdir(parents=True)
    (tmp_path / "services" / "rollout").mkdir(parents=True)
    planted = (
        "def push(client, http, path):\n"
        "    client.load_lora('policy-v1', path)\n"
        "    client.reload_weights(path, 1)\n"
        "    http.post('/v1/unload_lora_adapter', json={'lora_name': 'policy-v0'})\n"
    )
    (tmp_path / "services" / "trainer" / "publish.py").write_text(planted)
    (tmp_path / "services" / "rollout" / "loader.py").write_text(planted)  # the owner may
    for top in SCANNED:
        (tmp_path / top).mkdir(exist_ok=True)
    assert offenders(tmp_path) == [
        "services/trainer/publish.py:2: load_lora()",
        "services/trainer/publish.py:3: reload_weights()",
        "services/trainer/publish.py:4: '/v1/unload_lora_adapter'",
    ]


def test_the_exceptions_exist():
    """An exception that names no file any more is stale: it would silently cover a new one."""
    assert all((REPO / rel).exists() for rel in EXCEPTED)
