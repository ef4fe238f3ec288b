"""Parsing the JSON plan a decomposing planner writes (the recursive-reasoner agent), tolerant of chatter.

The model may wrap the JSON in ``` fences, surround it with prose, or put raw newlines inside strings; we
collect the top-level ``{…}`` candidates by brace depth (ignoring braces inside strings) and take the first
that parses, preferring one with ``should_decompose``.
"""

from __future__ import annotations

import json
from typing import Any


def _candidates(text: str) -> list[str]:
    """Top-level ``{…}`` substrings, found by brace depth outside string literals."""
    out, depth, start, in_str, escaped = [], 0, -1, False, False
    for i, ch in enumerate(text):
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                out.append(text[start : i + 1])
    return out


def _escape_newlines_in_strings(blob: str) -> str:
    """Replace raw newlines inside JSON string literals by ``\\n`` (models often emit them)."""
    out, in_str, escaped = [], False, False
    for ch in blob:
        if in_str and ch == "\n":
            out.append("\\n")
            continue
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        out.append(ch)
    return "".join(out)


def parse_planner_json(text: str) -> dict[str, Any] | None:
    """The planner's JSON object, or None: prefers a dict with ``should_decompose``, else the first dict."""
    text = text.replace("```json", "").replace("```", "")
    parsed: list[dict[str, Any]] = []
    for blob in _candidates(text):
        try:
            value = json.loads(_escape_newlines_in_strings(blob))
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            parsed.append(value)
    for value in parsed:
        if "should_decompose" in value:
            return value
    return parsed[0] if parsed else None


def plan_subproblems(plan: dict[str, Any]) -> list[str]:
    """The plan's subproblems when it decomposes (``should_decompose`` true and a non-empty list), else []."""
    subs = plan.get("subproblems") or []
    if not plan.get("should_decompose") or not isinstance(subs, list):
        return []
    return [str(s) for s in subs if str(s).strip()]
