"""Cost and shape rewards: token efficiency and the ``</think>`` format fraction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def token_efficiency(tokens: int, budget: int) -> float:
    """``1 − min(tokens / budget, 1)``: 1 for a free episode, 0 at or over the budget."""
    if budget <= 0:
        raise ValueError(f"token budget must be positive, got {budget}")
    return 1.0 - min(max(tokens, 0) / budget, 1.0)


def think_format_fraction(messages: Sequence[Mapping[str, Any]], require_tool_call: bool = True) -> float:
    """Fraction of assistant messages whose content contains ``</think>``.

    With ``require_tool_call`` (the upstream tool-calling agent's rule, ``docs/upstream.md``) the score is 0
    when no tool result is in the chat, so an agent cannot collect the format reward without searching.
    """
    if require_tool_call and not any(m.get("role") in ("tool", "ipython") for m in messages):
        return 0.0
    assistant = [m for m in messages if m.get("role") == "assistant"]
    if not assistant:
        return 0.0
    return sum("</think>" in (m.get("content") or "") for m in assistant) / len(assistant)
