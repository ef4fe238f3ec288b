"""The agents: each agent protocol with its episode driver, reward, services, metric and own knobs, one module each.

Words: an *agent* is a protocol defined here (search-r1, coda, …), chosen by ``[rollout] agent``; a *recipe* is
an experiment's TOML file (``configs/*.toml``) that names one. The package keeps its older name ``recipes``:
recipes name reward functions by module path (``recipes.rewards...:fn``), so renaming it would break them.

``AGENTS`` maps an agent's name to its ``Agent`` entry (``RECIPES`` is the old name of the same mapping). It is
collected from the modules of ``AGENT_MODULES``, each of which defines ``AGENTS = (Agent(...), ...)``: adding an
agent is one module (its protocol, knobs, demonstration format, reward and metric, see ``recipes.base``) and one
line in that list (and a recipe in ``configs/`` that uses it). The rollout's settings take each module's knobs
from the list (``agent_params``); make-sft calls the agent's demonstration format.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from recipes.base import Agent, AgentParams
    from recipes.core.context import AgentContext, Episode
    from recipes.core.demonstrations import DemoFormat
    from recipes.datasets import PromptRecord

# The agent modules, each holding one agent protocol (or a few variants of one) whole.
AGENT_MODULES = ("search_r1", "coda", "naive_rag", "tool_agent", "recursive_reasoner", "single_turn")

# From recipes.base, imported on first use.
_BASE = ("AgentParams", "Agent", "Scoring", "episode_reward", "load_reward")


@functools.cache
def _collect() -> dict[str, Agent]:
    # On first use, not at import: ``recipes.answers`` alone (the retriever's eval imports it) must not pull in
    # every agent.
    found: dict[str, Agent] = {}
    for module in AGENT_MODULES:
        for agent in importlib.import_module(f"{__name__}.{module}").AGENTS:
            if agent.name in found:
                raise RuntimeError(f"two agents are named {agent.name!r}")
            found[agent.name] = agent
    return found


def agent_params() -> dict[str, type[AgentParams]]:
    """Every agent module's knobs by their recipe table (``[rollout.<table>]``), in the list's order."""
    tables: dict[str, type[AgentParams]] = {}
    for agent in _collect().values():
        if agent.params is not None and tables.setdefault(agent.params.table, agent.params) is not agent.params:
            raise RuntimeError(f"two params models name the table {agent.params.table!r}")
    return tables


def __getattr__(name: str) -> object:
    if name in ("AGENTS", "RECIPES"):  # ``from recipes import AGENTS``: the mapping, collected on first use
        return _collect()
    if name in _BASE:
        return getattr(importlib.import_module("recipes.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_agent(name: str) -> Agent:
    """The agent named ``name``; a ``ValueError`` naming the known ones otherwise."""
    try:
        return _collect()[name]
    except KeyError:
        raise ValueError(f"unknown agent {name!r}; known: {', '.join(sorted(_collect()))}") from None


get_recipe = get_agent  # the old name, for user code written against it


def demo_formats() -> dict[str, DemoFormat]:
    """The agents' demonstration formats by name (make-sft's ``--format``: search, coda, rag), in the list's order."""
    formats: dict[str, DemoFormat] = {}
    for agent in _collect().values():
        fmt = agent.demonstrations
        if fmt is not None and formats.setdefault(fmt.name, fmt) is not fmt:
            raise RuntimeError(f"two demonstration formats are named {fmt.name!r}")
    return formats


def demo_format(name: str) -> DemoFormat:
    """The demonstration format of the agent ``name``, or the format named ``name``; a ``ValueError`` naming the
    known ones otherwise (also for an agent without demonstrations)."""
    agent = _collect().get(name)
    fmt = agent.demonstrations if agent is not None else demo_formats().get(name)
    if fmt is None:
        with_demos = sorted(n for n, a in _collect().items() if a.demonstrations is not None)
        raise ValueError(
            f"no demonstrations for {name!r}; agents with some: {', '.join(with_demos)}; "
            f"formats: {', '.join(demo_formats())}"
        )
    return fmt


async def run_episode(agent: str, ctx: AgentContext, record: PromptRecord) -> Episode:
    return await get_agent(agent).run(ctx, record)


__all__ = [
    "AGENTS",
    "AGENT_MODULES",
    "RECIPES",
    "Agent",
    "AgentParams",
    "Scoring",
    "agent_params",
    "demo_format",
    "demo_formats",
    "episode_reward",
    "get_agent",
    "get_recipe",
    "load_reward",
    "run_episode",
]
