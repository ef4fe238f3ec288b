"""The agent tag vocabulary, defined once: the tokenizer's added tokens, stop strings, format rewards and
parsers all read it from here. Which tags a role writes, its stop strings and its grammar are the role's own,
declared by its agent (``agents.core.turns.AgentRole``, collected by ``agents.roles()``).

The tag protocol is what must match the upstream projects (Search-R1, CoDA; ``docs/upstream.md``); prompts
live in ``agents/prompts.py``.
"""

from __future__ import annotations

# Tags a model writes or the environment inserts. Order is stable: the tokenizer's added-token ids follow it.
TAGS: tuple[str, ...] = ("think", "search", "answer", "task", "result", "documents", "refine", "information")

# Tags only the environment inserts; a policy that writes them is not rewarded for it.
OBSERVATION_TAGS: tuple[str, ...] = ("information", "documents", "result")


def open_tag(tag: str) -> str:
    return f"<{tag}>"


def close_tag(tag: str) -> str:
    return f"</{tag}>"


def all_tag_tokens() -> list[str]:
    """Every opening and closing tag, e.g. for a tokenizer's added tokens."""
    return [t for tag in TAGS for t in (open_tag(tag), close_tag(tag))]


# Hermes-style tool calling (the tool-agent recipe). Kept out of ``TAGS`` on purpose: the tiny tokenizer's
# added-token ids follow ``TAGS`` and must not shift; these strings tokenise as ordinary text.
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
THINK_CLOSE = "</think>"
