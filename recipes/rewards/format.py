"""Format rewards (per-tag scores, the strict role-aware tag-sequence validator) live in ``recipes.core.turns``
beside the tag parser; this path is kept for recipes that name ``recipes.rewards.format:…``."""

from recipes.core.turns import (
    is_valid_sequence,
    nonempty_role_format_score,
    nonempty_tag_format_score,
    role_format_score,
    tag_format_score,
    tag_sequence,
    validate_sequence,
)

__all__ = [
    "is_valid_sequence",
    "nonempty_role_format_score",
    "nonempty_tag_format_score",
    "role_format_score",
    "tag_format_score",
    "tag_sequence",
    "validate_sequence",
]
