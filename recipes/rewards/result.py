"""``RewardResult`` lives beside ``Episode`` in ``recipes.core.context``; this path is kept for recipes and code
that import it from here."""

from recipes.core.context import RewardResult

__all__ = ["RewardResult"]
