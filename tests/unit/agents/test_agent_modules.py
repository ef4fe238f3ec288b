"""An agent is one module: the explicit agent list names every module that defines agents, and each agent's
demonstration format is defined in its own module; the trainer and the other services hold no demonstration
format and no branch on an agent's or a format's name."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from agents import AGENT_MODULES, AGENTS, demo_format, demo_formats
from agents.core.demonstrations import DemoFormat
from tools.make_sft import add_arguments

ROOT = Path(__file__).resolve().parents[3]
OUTSIDE = ("services", "shared", "bench", "testing", "deploy")  # every package but agents/ (tests aside)


def _modules(*folders: str) -> list[Path]:
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def test_the_agent_list_names_every_module_that_defines_agents():
    defining = {
        p.stem
        for p in (ROOT / "agents").glob("*.py")
        if any(
            isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "AGENTS" for t in node.targets)
            for node in _tree(p).body
        )
    }
    assert defining == set(AGENT_MODULES)
    assert {agent.run.__module__ for agent in AGENTS.values()} == {f"agents.{m}" for m in AGENT_MODULES}


def test_each_demonstration_format_is_defined_in_its_agents_module():
    with_demos = {name: agent for name, agent in AGENTS.items() if agent.demonstrations is not None}
    assert {"search-r1", "thinker-searcher", "coda", "red-coda", "naive-rag"} <= set(with_demos)
    for name, agent in with_demos.items():
        fmt = agent.demonstrations
        assert isinstance(fmt, DemoFormat)
        own = {fmt.write.__module__, fmt.prompts.__module__, fmt.hop_queries.__module__} - {DemoFormat.__module__}
        assert own == {agent.run.__module__}, name
        assert demo_format(name) is fmt is demo_format(fmt.name)


def test_no_demonstration_is_built_outside_the_agents():
    """No function outside agents/ is a demonstration builder (named ``*demonstration``, as the agents' are) or
    encodes observations the way one does, and none imports what builds one (an agent's builders, ``assemble``,
    ``encode_observation``)."""
    builders = ("demonstration", "assemble", "encode_observation")
    for path in _modules(*OUTSIDE):
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert not node.name.endswith("demonstration"), f"{path}: {node.name}"
            if isinstance(node, ast.Attribute | ast.Name):
                name = node.attr if isinstance(node, ast.Attribute) else node.id
                assert name not in ("encode_observation", "assemble"), f"{path}:{node.lineno} {name}"
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agents"):
                for alias in node.names:
                    assert not alias.name.endswith(builders), f"{path}: imports {alias.name}"


def test_the_trainer_never_branches_on_an_agent_or_a_format():
    names = set(AGENTS) | set(demo_formats())
    for path in _modules("services/trainer"):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Compare):
                constants = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                assert not names & set(constants), f"{path}:{node.lineno} compares with {constants}"


@pytest.mark.parametrize(("argv", "agent"), [(["--format", "coda"], "coda"), (["--agent", "red-coda"], "coda")])
def test_make_sft_names_the_format_by_agent_or_by_its_old_name(argv, agent):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", "m", "--retriever-url", "http://r", "--out", "o", *argv])
    assert demo_format(args.agent or args.format) is AGENTS[agent].demonstrations
    assert parser.parse_args(["--model", "m", "--retriever-url", "u", "--out", "o"]).format == "search"
    with pytest.raises(ValueError, match="no demonstrations for 'single-turn'"):
        demo_format("single-turn")
