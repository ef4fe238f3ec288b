"""CoDA's instructions show each tag's format with a placeholder, never a concrete sub-question or answer: the
135M model copied the old examples into held-out episodes (bench/results/qa.md: 58 of 150 delegated the
example task, 37 answered the example answer)."""

from __future__ import annotations

import re

from agents.prompts import EXECUTOR_SYSTEM, PLANNER_SYSTEM, executor_messages, planner_messages

# What may stand between a tag's opener and closer in the instructions: a description of what goes there.
PLACEHOLDERS = {"one sub-question", "a query"}


def filled_tags(text: str) -> list[tuple[str, str]]:
    """``(tag, content)`` of every ``<tag> content </tag>`` written out in ``text`` (not the phrase
    "between <tag> and </tag>", which names the tags)."""
    blocks = [(m.group(1), m.group(2).strip()) for m in re.finditer(r"<(\w+)>([^<]*)</\1>", text)]
    return [(tag, content) for tag, content in blocks if content != "and"]


def test_the_planner_and_executor_show_placeholders_only():
    shown = filled_tags(PLANNER_SYSTEM) + filled_tags(EXECUTOR_SYSTEM)
    assert shown == [("task", "one sub-question"), ("search", "a query")]
    assert {content for _, content in shown} <= PLACEHOLDERS
    # The answer's format is said in words; a written-out <answer> block would be a string to copy.
    assert not [tag for tag, _ in shown if tag == "answer"]


def test_what_the_agents_render_holds_no_other_example():
    for messages in (planner_messages("Q?"), executor_messages("T?")):
        for message in messages:
            assert {content for _, content in filled_tags(message["content"])} <= PLACEHOLDERS
