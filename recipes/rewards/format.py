"""Format rewards: the graduated per-tag score (and its variant that pays only for tags with content, CoDA's
per-role reward), and the strict tag-sequence validator, role-aware.

Tag lists come from ``shared.tags.ROLE_TAGS``, so the planner is scored on think/task/answer and the executor
on think/search/refine/answer, whatever its prompt happens to contain (upstream CoDA picked the list by
looking for ``<refine>`` in the text, which scored planners against the executor list when prompts were mixed
up; ``docs/upstream.md``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from shared.tags import ROLE_TAGS, TAGS, close_tag, open_tag

# The strict grammar per role over the sequence of top-level tag blocks (space-joined, trailing space).
# Observation tags are inserted by the environment, so a valid trajectory alternates call → observation.
_GRAMMARS: dict[str, re.Pattern[str]] = {
    "policy": re.compile(r"think (?:search information think )*answer "),
    "thinker": re.compile(r"think (?:search information think )*answer "),
    "planner": re.compile(r"think (?:task result think )*answer "),
    # The executor prompt asks for a <refine> summary after every search; a further <think> is optional.
    "executor": re.compile(r"think (?:search documents refine (?:think )?)*answer "),
}
_BLOCK = re.compile(r"<(?P<tag>[a-z_]+)>(?P<body>.*?)</(?P=tag)>", re.DOTALL)
_ANY_TAG = re.compile("|".join(re.escape(t) for tag in TAGS for t in (open_tag(tag), close_tag(tag))))


def tag_format_score(response: str, tags: Sequence[str]) -> float:
    """Graduated score: ``Σ_tag 1/N · 1[count(<tag>) > 0 and count(<tag>) == count(</tag>)]``, N = len(tags).

    E.g. the executor list has 4 tags, so each balanced, present tag is worth 0.25.
    """
    if not tags:
        return 0.0
    ok = sum(1 for t in tags if 0 < response.count(open_tag(t)) == response.count(close_tag(t)))
    return ok / len(tags)


def role_format_score(response: str, role: str) -> float:
    """``tag_format_score`` with the tags ``role`` writes itself (``shared.tags.ROLE_TAGS[role]``)."""
    return tag_format_score(response, ROLE_TAGS[role])


def nonempty_tag_format_score(response: str, tags: Sequence[str]) -> float:
    """``tag_format_score`` that pays only for content: ``Σ_tag 1/N · 1[tag present, balanced, and every
    <tag>…</tag> block holds non-whitespace text]``.

    ``tag_format_score`` pays for ``<answer></answer>``, so a policy learns the tags without saying anything in
    them. "Every block": the number of ``<tag>…</tag>`` blocks must equal the number of opening tags (a stray
    ``</tag>`` before its ``<tag>``, or a nested one, leaves fewer blocks and fails), and none may be blank.
    """
    if not tags:
        return 0.0
    return sum(1 for t in tags if _filled(response, t)) / len(tags)


def nonempty_role_format_score(response: str, role: str) -> float:
    """``nonempty_tag_format_score`` with the tags ``role`` writes itself (``shared.tags.ROLE_TAGS[role]``)."""
    return nonempty_tag_format_score(response, ROLE_TAGS[role])


def _filled(response: str, tag: str) -> bool:
    opens = response.count(open_tag(tag))
    if not 0 < opens == response.count(close_tag(tag)):
        return False
    blocks = re.findall(f"{re.escape(open_tag(tag))}(.*?){re.escape(close_tag(tag))}", response, flags=re.DOTALL)
    return len(blocks) == opens and all(b.strip() for b in blocks)


def tag_sequence(response: str) -> tuple[list[str] | None, str]:
    """Split ``response`` into top-level ``<tag>…</tag>`` blocks: ``(tags, "")`` or ``(None, reason)``.

    Only whitespace may sit between blocks; a block may not contain another vocabulary tag.
    """
    tags: list[str] = []
    pos, n = 0, len(response)
    while True:
        while pos < n and response[pos].isspace():
            pos += 1
        if pos == n:
            return tags, ""
        m = _BLOCK.match(response, pos)
        if m is None:
            return None, f"text outside a tag block at offset {pos}"
        if m["tag"] not in TAGS:
            return None, f"unknown tag <{m['tag']}> at offset {pos}"
        if _ANY_TAG.search(m["body"]):
            return None, f"nested tag inside <{m['tag']}> at offset {pos}"
        tags.append(m["tag"])
        pos = m.end()


def validate_sequence(response: str, role: str = "policy") -> tuple[bool, str]:
    """Strict validator: does ``response`` follow its role's grammar? Returns ``(valid, reason)``.

    Grammars (top-level blocks, whitespace only between them; the response is the text after the prompt):
      policy/thinker: think → (search → information → think)* → answer
      planner:        think → (task → result → think)* → answer
      executor:       think → (search → documents → refine → think?)* → answer
    """
    tags, reason = tag_sequence(response)
    if tags is None:
        return False, reason
    if not tags:
        return False, "no tag blocks"
    joined = "".join(f"{t} " for t in tags)
    if _GRAMMARS[role].fullmatch(joined) is None:
        return False, f"tag order {' → '.join(tags)} does not match the {role} grammar"
    return True, ""


def is_valid_sequence(response: str, role: str = "policy") -> bool:
    """``validate_sequence(...)[0]``."""
    return validate_sequence(response, role)[0]
