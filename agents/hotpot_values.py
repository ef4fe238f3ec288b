"""A HotpotQA comparison's compared values, read from its two gold paragraphs.

HotpotQA has no evidence triples, so ``agents.plans`` gives its comparison rows no sub-questions. The shapes
2Wiki shares (born / died / released / founded first or later, the same nationality) are read with
``agents.plan_values``' rules; HotpotQA adds a few of its own whose values its paragraphs write in fixed
shapes: events and court cases ("Which case came first": the year of the paragraph's first date), works
"produced first" / "came first" (the description's year), counts ("Which genus has more species": "a genus of
about 15 species", "an opera in five acts", "released six studio albums") and heights ("Which building is
taller": "a 749 ft, 44-story building"). Triples are shaped as 2Wiki's, ``[title, relation, value]``.

As for 2Wiki, a triple pair is kept only when its values imply the gold answer. HotpotQA's golds name a
person in full where the title does not ("Arthur Ignatius Conan Doyle" for "Arthur Conan Doyle"): a gold
holding every word of one compared title and not of the other names that one. Not read: "Are X and Y both
<category>?" (a yes/no on a category needs no compared value), "more members" (the paragraphs list members,
they do not count them), "larger", "busier", "more awards" (no value, or none both paragraphs write).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from agents.answers import normalize_answer
from agents.plan_values import (
    DATE,
    EARLY,
    LATE,
    compared_relation,
    date_year,
    earlier,
    names,
    nationality_values,
    paragraph_of,
    value,
    without_names,
)
from agents.plans import entity, question_type

_EVENT = re.compile(r"\b(?:battles?|wars?|case|invasion|took place|occurred|fought|happened)\b", re.I)
_WORK = re.compile(r"\b(?:documentar(?:y|ies)|films?|movies?|albums?|books?|novels?|games?)\b", re.I)
# "older" asks a person's birth in 2Wiki's shapes; of a magazine or a band it asks its founding.
_ORGANISATION = re.compile(r"\b(?:magazines?|newspapers?|bands?|companies|company|groups?|clubs?)\b", re.I)
_NUMBER_WORDS = {
    "a single": 1,
    "single": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "twenty": 20,
}
_COUNT = (
    r"(?:(?:about|approximately|around|some|over|nearly)\s+)?(?P<n>\d[\d,]*(?:\s*[–-]\s*\d[\d,]*)?|"
    + "|".join(sorted(_NUMBER_WORDS, key=len, reverse=True))
    + ")"
)
# (the question's words, the relation, the noun the paragraph counts); "more" / "fewer" say which end wins.
_COUNTS = (
    (re.compile(r"\bspecies\b", re.I), "number of species", r"species"),
    (re.compile(r"\bacts\b", re.I), "number of acts", r"acts"),
    (re.compile(r"\bstudio albums\b", re.I), "number of studio albums", r"studio albums"),
)
_MORE = re.compile(r"\b(?:more|most|larger number)\b", re.I)
_FEWER = re.compile(r"\b(?:fewer|fewest|less|least)\b", re.I)
_TALLER = re.compile(r"\btaller\b", re.I)
_HEIGHT = re.compile(r"\b(?P<n>\d[\d,]*)\s*(?:ft|foot|feet)\b")


def hotpot_relation(shape: str) -> tuple[str, str] | None:
    """(the compared relation, ``early`` | ``late`` | ``same`` | ``high`` | ``low``) a HotpotQA comparison
    (its names taken out) asks about; None for a shape not read."""
    for words, relation, _noun in _COUNTS:
        if words.search(shape) and bool(_MORE.search(shape)) != bool(_FEWER.search(shape)):
            return relation, "high" if _MORE.search(shape) else "low"
    if _TALLER.search(shape):
        return "height", "high"
    early, late = EARLY.search(shape), LATE.search(shape)
    order = None if bool(early) == bool(late) else "early" if early else "late"
    if _EVENT.search(shape) and order:
        return "point in time", order
    asked = compared_relation(shape)
    if asked is None and order and _WORK.search(shape) and re.search(r"\b(?:came|produced|made)\b", shape, re.I):
        return "publication date", order
    if asked and asked[0] == "date of birth" and _ORGANISATION.search(shape):
        return "inception", asked[1]
    return asked


def count(relation: str, paragraph: str) -> str | None:
    """A count as the paragraph writes it, with its noun: "about 15 species", "five acts", "six studio albums"."""
    noun = next(n for _w, r, n in _COUNTS if r == relation)
    m = re.search(rf"\b{_COUNT}\s+(?:\w+\s+)?{noun}\b", paragraph, re.I)
    return m[0] if m else None


def count_range(text: str) -> tuple[int, int] | None:
    """(low, high) of a written count: "about 15 species" → (15, 15), "75–100 species" → (75, 100)."""
    m = re.search(_COUNT, text, re.I)
    if m is None:
        return None
    n = m["n"].lower()
    if n in _NUMBER_WORDS:
        return _NUMBER_WORDS[n], _NUMBER_WORDS[n]
    ends = [int(x.replace(",", "")) for x in re.split(r"\s*[–-]\s*", n)]
    return ends[0], ends[-1]


def height(paragraph: str) -> str | None:
    """The greatest height in feet the paragraph writes ("Originally proposed to be 1300 ft ... topped out at
    1396 ft": the building as built is the tallest figure given)."""
    found = list(_HEIGHT.finditer(paragraph))
    return max(found, key=lambda m: int(m["n"].replace(",", "")))[0] if found else None


def event_year(paragraph: str) -> str | None:
    """The year of the paragraph's first date: a battle's "(1–26 June 1918)", a case's "429 U.S. 190 (1976)".
    Only the year: a range's day is the start or the end, which the question does not say."""
    m = DATE.search(paragraph[:600])
    return date_year(m) if m else None


def _read(relation: str, paragraph: str) -> str | None:
    if relation.startswith("number of "):
        return count(relation, paragraph)
    if relation == "height":
        return height(paragraph)
    if relation == "point in time":
        return event_year(paragraph)
    return value(relation, paragraph)


def _higher(values: list[str], relation: str) -> int | None:
    """0 when the first value is the greater, 1 when the second; None when they cannot tell (equal, or
    ranges that overlap)."""
    if relation == "height":
        a, b = (int(_HEIGHT.search(v)["n"].replace(",", "")) for v in values)
        ranges = [(a, a), (b, b)]
    else:
        ranges = [count_range(v) for v in values]
        if None in ranges:
            return None
    (lo0, hi0), (lo1, hi1) = ranges
    return 0 if lo0 > hi1 else 1 if lo1 > hi0 else None


def _words(text: str) -> set[str]:
    return set(normalize_answer(text).split())


def names_gold(title: str, other: str, golds: list[str]) -> bool:
    """Whether a gold names ``title`` (and not ``other``): the same name, or one that holds every word of it
    and not every word of the other's ("Arthur Ignatius Conan Doyle" for "Arthur Conan Doyle")."""
    name, rival = _words(entity(title)), _words(entity(other))
    return any(
        normalize_answer(g) == normalize_answer(entity(title)) or (name <= _words(g) and not rival <= _words(g))
        for g in golds
    )


def _winner(values: list[str], relation: str, order: str) -> int | None:
    """Which compared entity (0, 1) the values make the answer."""
    if order in ("high", "low"):
        which = _higher(values, relation)
        return None if which is None else which if order == "high" else 1 - which
    which = earlier(values[0], values[1])
    return None if which is None else which if order == "early" else 1 - which


def _agrees(winner: int, compared: list[str], golds: list[str], question: str) -> bool:
    """A gold naming the winner, or, for "Is X taller than Y?", "yes" iff X (the first named) is the winner."""
    gold = {normalize_answer(g) for g in golds}
    if gold in ({"yes"}, {"no"}):
        return re.match(r"\s*(?:is|was|are|were|did|does)\b", question, re.I) is not None and (winner == 0) == (
            gold == {"yes"}
        )
    return names_gold(compared[winner], compared[1 - winner], golds)


def _undescribed(text: str) -> str:
    """Without the lowercase compound before a description's demonym ("is an award-winning Austrian artist",
    "was a twentieth-century Icelandic writer"), which ``plan_values.nationalities`` stops at."""
    return re.sub(r"\b(?:is|was)\s+(?:a|an)\s+(?:[a-z]+-)+[a-z]+\s+(?=[A-Z])", "is a ", text)


def paragraph_evidences(row: dict, paragraphs: Mapping[str, str]) -> list[list[str]] | None:
    """Evidence triples for a HotpotQA comparison row, read from ``paragraphs`` (supporting title → paragraph
    text); None when the row has triples, is another type, its question or paragraphs are not read, or the
    values read do not imply its gold answer."""
    meta = row.get("metadata") or {}
    if meta.get("evidences") or question_type(row) != "comparison":
        return None
    question, golds = row["question"], [str(g) for g in row["golden_answers"]]
    titles = [str(t) for t in meta.get("supporting_titles") or []]
    compared = [t for t in titles if names(question, t)]
    if len(titles) != 2 or len(compared) != 2:
        return None
    # In question order: "Is X taller than Y?" says which one "yes" is about.
    lower = question.lower()
    compared.sort(key=lambda t: lower.find(entity(t).lower()) % (len(lower) + 1))
    asked = hotpot_relation(without_names(question, compared))
    texts = [paragraph_of(paragraphs, t) for t in compared]
    if asked is None or any(t is None for t in texts):
        return None
    relation, order = asked
    if order == "same":
        values = nationality_values([_undescribed(t) for t in texts], golds)
    else:
        values = [_read(relation, t) for t in texts]
        if any(v is None for v in values):
            return None
        winner = _winner(values, relation, order)
        if winner is None or not _agrees(winner, compared, golds, question):
            return None
    return None if values is None else [[t, relation, v] for t, v in zip(compared, values, strict=True)]
