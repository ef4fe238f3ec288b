"""launcher's public API: what ``make train`` runs on and the bench drives the stack through (and nothing
else of the stack's modules is imported from bench/)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import launcher as stack
from launcher import start_from_checkpoint

BENCH = Path(__file__).resolve().parents[3] / "bench"


def test_every_public_name_resolves_and_is_documented():
    assert sorted(stack.__all__) == sorted(stack._API)
    for name in stack.__all__:
        assert getattr(stack, name).__doc__, name
    assert all(
        getattr(stack.LocalStack, m).__doc__ for m in ("rollout_service", "restart_inference", "load_last_adapter")
    )


def test_the_bench_imports_the_stack_only_through_its_public_api():
    for path in BENCH.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("launcher"):
                assert node.module == "launcher", f"{path.name}: from {node.module} import ..."
                assert {a.name for a in node.names} <= set(stack.__all__), path.name
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("launcher") for a in node.names), path.name


def test_the_stack_drivers_touch_no_private_attribute():
    for name in ("qa.py", "ablation.py"):
        tree = ast.parse((BENCH / name).read_text())
        private = [
            n.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and n.attr.startswith("_")
            and not n.attr.startswith("__")
            and not (isinstance(n.value, ast.Name) and n.value.id == "self")
        ]
        assert private == [], name


def test_a_run_starts_from_another_runs_newest_checkpoint_without_its_rng_or_queue(tmp_path):
    source = tmp_path / "warm"
    for step in (5, 10):
        folder = source / f"step-{step:08d}"
        folder.mkdir(parents=True)
        state = {"step": step, "covered": ["1-0"], "trained_groups": ["g"], "recent_groups": ["g"], "groups_trained": 3}
        (folder / "state.json").write_text(json.dumps(state))
        (folder / "rng-0.pt").write_bytes(b"rng")
        (folder / "model.bin").write_bytes(b"weights")
    assert start_from_checkpoint(source, tmp_path / "arm" / "checkpoints") == 10
    copy = tmp_path / "arm" / "checkpoints" / "step-00000010"
    assert json.loads((copy / "state.json").read_text()) == {
        "step": 10,
        "covered": [],
        "trained_groups": [],
        "recent_groups": [],
        "groups_trained": 0,
    }
    assert not (copy / "rng-0.pt").exists() and (copy / "model.bin").read_bytes() == b"weights"
    assert (source / "step-00000010" / "rng-0.pt").exists()  # the source is left as it was
