"""Recipes: each agent protocol with its episode driver, reward, services and metric, in one module each.

``RECIPES`` maps an agent's name (``[rollout] agent``) to its ``Recipe``. It is collected from this
package's modules: a module that defines ``RECIPES = (Recipe(...), ...)`` is a recipe module, so adding one
touches that module (and its TOML in ``configs/``) and nothing else.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from recipes.base import Recipe
    from recipes.core.context import AgentContext, Episode
    from recipes.datasets import PromptRecord

_BASE = ("Recipe", "Scoring", "episode_reward", "load_reward")  # from recipes.base, imported on first use


@functools.cache
def _collect() -> dict[str, Recipe]:
    # On first use, not at import: ``recipes.answers`` alone (the retriever's eval imports it) must not pull in
    # every agent.
    found: dict[str, Recipe] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.ispkg or info.name == "base":
            continue
        for recipe in getattr(importlib.import_module(f"{__name__}.{info.name}"), "RECIPES", ()):
            if recipe.name in found:
                raise RuntimeError(f"two recipes are named {recipe.name!r}")
            found[recipe.name] = recipe
    return found


def __getattr__(name: str) -> object:
    if name == "RECIPES":  # ``from recipes import RECIPES``: the mapping, collected on first use
        return _collect()
    if name in _BASE:
        return getattr(importlib.import_module("recipes.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_recipe(name: str) -> Recipe:
    try:
        return _collect()[name]
    except KeyError:
        raise ValueError(f"unknown agent {name!r}; known: {', '.join(sorted(_collect()))}") from None


async def run_episode(agent: str, ctx: AgentContext, record: PromptRecord) -> Episode:
    return await get_recipe(agent).run(ctx, record)


__all__ = ["RECIPES", "Recipe", "Scoring", "episode_reward", "get_recipe", "load_reward", "run_episode"]
