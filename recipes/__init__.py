"""The agents: each agent protocol with its episode driver, reward, services, metric and own knobs, one module each.

Words: an *agent* is a protocol defined here (search-r1, coda, …), chosen by ``[rollout] agent``; a *recipe* is
an experiment's TOML file (``configs/*.toml``) that names one. The package keeps its older name ``recipes``:
recipes name reward functions by module path (``recipes.rewards...:fn``), so renaming it would break them.

``AGENTS`` maps an agent's name to its ``Agent`` entry (``RECIPES`` is the old name of the same mapping). It is
collected from this package's modules: a module that defines ``AGENTS = (Agent(...), ...)`` is an agent module,
so adding an agent touches that module (and a recipe in ``configs/`` that uses it) and nothing else. Its knobs, if
any, are an ``AgentParams`` model in the same module, added to ``RolloutSettings``'s bases.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from recipes.base import Agent, AgentParams
    from recipes.core.context import AgentContext, Episode
    from recipes.datasets import PromptRecord

# From recipes.base, imported on first use.
_BASE = ("AgentParams", "Agent", "Scoring", "episode_reward", "load_reward")


@functools.cache
def _collect() -> dict[str, Agent]:
    # On first use, not at import: ``recipes.answers`` alone (the retriever's eval imports it) must not pull in
    # every agent.
    found: dict[str, Agent] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.ispkg or info.name == "base":
            continue
        for agent in getattr(importlib.import_module(f"{__name__}.{info.name}"), "AGENTS", ()):
            if agent.name in found:
                raise RuntimeError(f"two agents are named {agent.name!r}")
            found[agent.name] = agent
    return found


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


async def run_episode(agent: str, ctx: AgentContext, record: PromptRecord) -> Episode:
    return await get_agent(agent).run(ctx, record)


__all__ = [
    "AGENTS",
    "RECIPES",
    "Agent",
    "AgentParams",
    "Scoring",
    "episode_reward",
    "get_agent",
    "get_recipe",
    "load_reward",
    "run_episode",
]
