"""Open and choice questions: which questions a reader must answer by reading, and what a guess scores.

A multi-hop question is a *choice* when its gold answer is yes/no or is named in the question itself ("Which film
came out first, X or Y?" → X or Y; "Are X and Y both American?" → yes/no): an agent that learns to pick one of
the candidates scores about half of its F1 there without reading a hop. Every other question is *open*: its
answer appears nowhere in the question and has to be found. On 2WikiMultihopQA the rule splits the labelled types
cleanly (comparison + bridge_comparison are choices, compositional + inference open); on HotpotQA it separates
its comparison questions from the bridge ones without a label.

``guess`` is the reading-free answer a choice baseline gives: the first candidate the question names, else "yes".
Pure functions over strings, so the report, the rollout's sampler and the tests share one definition.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from agents.answers import as_gold_list, normalize_answer

QuestionKind = Literal["open", "choice"]
KINDS: tuple[QuestionKind, ...] = ("open", "choice")
_YES_NO = frozenset({"yes", "no"})
# "..., X or Y?" — the candidates sit after the question's last comma (or after its wh-clause when it has none).
_OR = re.compile(r"\s+or\s+", re.IGNORECASE)
_LEAD = re.compile(
    r"^(?:which|who|what|where|when)\b.*?\b(?:first|earlier|later|older|younger|longer|more|less|first,|between)\b\s*",
    re.IGNORECASE,
)
_AUX = re.compile(r"^(?:was|were|is|are|did|does|do|has|have)\s+(?:the\s+)?", re.IGNORECASE)
_ARTICLE = re.compile(r"^the\s+", re.IGNORECASE)
_NAME_RUN = re.compile(r"(?:[A-Z0-9\u00c0-\u024f][\w.'\u00c0-\u024f-]*(?:\s+|$))+")
_TRAILING_CLAUSE = re.compile(r"\s+(?:born|died|released|founded|came|was|is)\b.*$", re.IGNORECASE)


def question_kind(question: str, golds: str | Iterable[str]) -> QuestionKind:
    """``choice`` when some gold answer is yes/no or its normalised words appear, as a run, in the normalised
    question; else ``open``. A gold that normalises to nothing does not make a question a choice."""
    asked = f" {normalize_answer(question)} "
    for gold in as_gold_list(golds):
        norm = normalize_answer(gold)
        if norm in _YES_NO or (norm and f" {norm} " in asked):
            return "choice"
    return "open"


def candidates(question: str) -> list[str]:
    """The alternatives a question names (``..., A or B?``, ``Was A or B born first?``, ``... out of A and B?``,
    ``between A and B``); [] when it names none. A heuristic over the wording: of the bundled choice questions whose answer
    is not yes/no, it misses the answer among its candidates in 9 of 2Wiki's (names with commas) and 18 of
    HotpotQA's (free wording)."""
    text = question.strip().rstrip("?").strip()
    pair = re.search(r"\b(?:out of|between)\s+(.+?)\s+and\s+(.+)$", text, re.IGNORECASE)
    if pair and not _OR.search(text):
        return [pair.group(1).strip(" ,"), _TRAILING_CLAUSE.sub("", pair.group(2)).strip(" ,")]
    parts = _OR.split(text)
    if len(parts) < 2:
        return []
    left, right = " or ".join(parts[:-1]).rstrip(" ,"), parts[-1]
    if _AUX.match(left):  # "Was A or B born first": A after the verb, B the capitalised run after "or"
        left = _AUX.sub("", left)
        run = _NAME_RUN.match(_ARTICLE.sub("", right))
        right = run.group(0) if run else right
    elif "," in left:
        left = left.rsplit(",", 1)[1]
    else:
        left = _LEAD.sub("", left)
    left, right = left.strip(" ,"), right.strip(" ,")
    return [left, right] if left and right else []


def guess(question: str) -> str:
    """The answer a reader of nothing gives: the first candidate the question names, else "yes"."""
    named = candidates(question)
    return named[0] if named else "yes"
