"""The agent tag vocabulary, defined once: the tokenizer's added tokens, stop strings, format rewards and
parsers all read it from here.

The tag protocol is what must match the upstream projects (Search-R1, CoDA; ``docs/upstream.md``); prompts
live in ``agents/prompts.py``.
"""

from __future__ import annotations

# Tags a model writes or the environment inserts. Order is stable: the tokenizer's added-token ids follow it.
TAGS: tuple[str, ...] = ("think", "search", "answer", "task", "result", "documents", "refine", "information")

# Which tags each role may write itself (format rewards are role-aware).
ROLE_TAGS: dict[str, tuple[str, ...]] = {
    "policy": ("think", "search", "answer"),  # flat Search-R1
    "planner": ("think", "task", "answer"),  # CoDA planner; receives <result>
    "executor": ("think", "search", "refine", "answer"),  # CoDA executor; receives <documents>
    "thinker": ("think", "search", "answer"),  # delegates <search> to the searcher service
}

# Tags only the environment inserts; a policy that writes them is not rewarded for it.
OBSERVATION_TAGS: tuple[str, ...] = ("information", "documents", "result")


def open_tag(tag: str) -> str:
    return f"<{tag}>"


def close_tag(tag: str) -> str:
    return f"</{tag}>"


def all_tag_tokens() -> list[str]:
    """Every opening and closing tag, e.g. for a tokenizer's added tokens."""
    return [t for tag in TAGS for t in (open_tag(tag), close_tag(tag))]


def stop_strings(role: str) -> list[str]:
    """Strings that end a policy turn for ``role``: the closers of its action tags."""
    actions = {
        "policy": ("search", "answer"),
        "thinker": ("search", "answer"),
        "planner": ("task", "answer"),
        "executor": ("search", "answer"),
    }[role]
    return [close_tag(t) for t in actions]


# Hermes-style tool calling (the tool-agent recipe). Kept out of ``TAGS`` on purpose: the tiny tokenizer's
# added-token ids follow ``TAGS`` and must not shift; these strings tokenise as ordinary text.
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
THINK_CLOSE = "</think>"
