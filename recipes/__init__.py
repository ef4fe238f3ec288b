"""Recipes: each agent protocol with its episode driver, reward, services and metric, in one module each.

``RECIPES`` maps an agent's name (``[rollout] agent``) to its ``Recipe``. It is collected from this
package's modules: a module that defines ``RECIPES = (Recipe(...), ...)`` is a recipe module, so adding one
touches that module (and its TOML in ``configs/``) and nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil

from recipes.base import Recipe, Scoring, episode_reward, load_reward
from shared.agents.context import AgentContext, Episode
from shared.datasets import PromptRecord


def _collect() -> dict[str, Recipe]:
    found: dict[str, Recipe] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.ispkg or info.name == "base":
            continue
        for recipe in getattr(importlib.import_module(f"{__name__}.{info.name}"), "RECIPES", ()):
            if recipe.name in found:
                raise RuntimeError(f"two recipes are named {recipe.name!r}")
            found[recipe.name] = recipe
    return found


RECIPES: dict[str, Recipe] = _collect()


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown agent {name!r}; known: {', '.join(sorted(RECIPES))}") from None


async def run_episode(agent: str, ctx: AgentContext, record: PromptRecord) -> Episode:
    return await get_recipe(agent).run(ctx, record)


__all__ = ["RECIPES", "Recipe", "Scoring", "episode_reward", "get_recipe", "load_reward", "run_episode"]
