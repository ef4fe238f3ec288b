"""The agents: each agent protocol with its episode driver, reward, services, metric and own knobs, one module each.

Words: an *agent* is a protocol defined here (search-r1, coda, …), chosen by ``[rollout] agent``; a *recipe* is
an experiment's TOML file (``configs/*.toml``) that names one (and may name a reward function by module path,
``agents.rewards...:fn``).

``AGENTS`` maps an agent's name to its ``Agent`` entry. It is
collected from the modules of ``AGENT_MODULES``, each of which defines ``AGENTS = (Agent(...), ...)``: adding an
agent is one module (its protocol, knobs, demonstration format, reward and metric, see ``agents.base``) and one
line in that list (and a recipe in ``configs/`` that uses it). The rollout's settings take each module's knobs
from the list (``agent_params``); make-sft calls the agent's demonstration format.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agents.base import Agent, AgentParams
    from agents.core.demonstrations import DemoFormat
    from agents.core.turns import AgentRole

# The agent modules, each holding one agent protocol (or a few variants of one) whole.
AGENT_MODULES = ("search_r1", "coda", "naive_rag", "tool_agent", "recursive_reasoner", "single_turn")

# From agents.base, imported on first use.
_BASE = ("AgentParams", "Agent", "Scoring", "episode_reward", "load_reward")


@functools.cache
def _collect() -> dict[str, Agent]:
    # On first use, not at import: ``agents.answers`` alone (the retriever's eval imports it) must not pull in
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
    if name == "AGENTS":  # ``from agents import AGENTS``: the mapping, collected on first use
        return _collect()
    if name in _BASE:
        return getattr(importlib.import_module("agents.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def roles() -> dict[str, AgentRole]:
    """The trajectory roles the agents declare (``Agent.roles``) by name, in the list's order: the tables of role
    tags, grammars and stop strings (``agents.core.turns``) read them from here.

    Several agents may declare one name (a ``policy``, a ``planner``); where more than one declares tags or a
    grammar for it, they must declare the same (a role's format score and grammar are keyed by its name). A
    declaration without tags or grammar (a JSON planner, a tool-calling policy) only names the wire role.
    """
    found: dict[str, AgentRole] = {}
    for agent in _collect().values():
        for role in agent.roles:
            known = found.get(role.name)
            if known is None or (not known.tags and known.grammar is None):
                found[role.name] = role
            elif (role.tags or role.grammar is not None) and role != known:
                raise RuntimeError(
                    f"agent {agent.name!r} declares role {role.name!r} unlike another agent: {role} ≠ {known}"
                )
    return found


def get_agent(name: str) -> Agent:
    """The agent named ``name``; a ``ValueError`` naming the known ones otherwise."""
    try:
        return _collect()[name]
    except KeyError:
        raise ValueError(f"unknown agent {name!r}; known: {', '.join(sorted(_collect()))}") from None


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


__all__ = [
    "AGENTS",
    "AGENT_MODULES",
    "Agent",
    "AgentParams",
    "Scoring",
    "agent_params",
    "demo_format",
    "demo_formats",
    "episode_reward",
    "get_agent",
    "load_reward",
    "roles",
]
