"""A 2Wiki comparison's compared values, read from its gold paragraphs where the row has no evidence triples.

About a fifth of 2Wiki's comparison and bridge_comparison rows come without ``evidences``, so ``agents.plans``
cannot say what each sub-question's result is and the row gets no planner demonstration. Their gold paragraphs
say it in a few fixed shapes ("Rudolph Maté( 21 January 1898 – 27 October 1964)", "is a 1957 American Western
film"): ``paragraph_evidences`` reads them into triples shaped as 2Wiki's own (``[subject, relation, object]``),
so ``plans._levels`` and the comparison builders use them unchanged.

A triple set is kept only when its values imply the gold answer (the earlier date's entity for "first", equal
nationalities iff the gold is "yes"): a misread paragraph then drops the row instead of teaching a wrong result.
Not read: "lived longer" (two facts per entity, which a comparison's one-fact-per-entity plan does not hold) and
"located in the same country" (telling a country's name from a province's would need a gazetteer).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from agents.answers import normalize_answer
from agents.plans import entity, question_type

_MONTH = (
    r"(?:January|February|March|April|May|June|July|August|September|October|November|December|"
    r"Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)\.?"
)
# A date as 2Wiki's paragraphs write it: "23 March 1946", "November 22, 1917", "January 1973", "1952".
DATE = re.compile(
    rf"\b(?:(?P<d1>\d{{1,2}})\s+(?P<m1>{_MONTH}),?\s+(?P<y1>\d{{3,4}})"
    rf"|(?P<m2>{_MONTH})\s+(?P<d2>\d{{1,2}}),?\s+(?P<y2>\d{{3,4}})"
    rf"|(?P<m3>{_MONTH})\s+(?P<y3>\d{{3,4}})"
    r"|(?P<y4>\d{4}))(?![\d'’s])"
)
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
# The order words that ask for the earlier / the later of two values.
EARLY = re.compile(r"\b(?:first|earlier|sooner|older)\b", re.I)
LATE = re.compile(r"\b(?:later|last|more recently|most recently|younger)\b", re.I)
# 2Wiki's question shapes, most specific first: (pattern, the compared relation); the order words decide which
# end of the dates the gold is at.
_SHAPES = (
    (re.compile(r"\b(?:older|younger)\b|\bborn\b", re.I), "date of birth"),
    (re.compile(r"\b(?:died|die)\b", re.I), "date of death"),
    (re.compile(r"\b(?:magazine|newspaper|journal)\b|\b(?:founded|established|formed)\b", re.I), "inception"),
    (re.compile(r"\b(?:released|came out|come out|published)\b", re.I), "publication date"),
    (re.compile(r"\bsame nationality\b|\bsame country\b", re.I), "country of citizenship"),
)
_NOT_READ = re.compile(r"\blived longer\b|\blocated\b", re.I)
# Works, whose country is their origin rather than a citizenship ("is a 1951 Italian war film", not "is an
# American film director").
_WORK = re.compile(
    r"\b(?:films?|movies?|bands?|albums?|songs?|series)\b"
    r"(?!\s+(?:director|actor|actress|producer|editor|critic|composer|maker|writer|star))",
    re.I,
)
_FIRST_HOP = (
    (re.compile(r"\bdirectors?\b", re.I), "director"),
    (re.compile(r"\bcomposers?\b", re.I), "composer"),
    (re.compile(r"\bperformers?\b", re.I), "performer"),
    (re.compile(r"\bfounders?\b", re.I), "founded by"),
    (re.compile(r"\bfathers?\b", re.I), "father"),
    (re.compile(r"\bmothers?\b", re.I), "mother"),
    (re.compile(r"\b(?:spouses?|husbands?|wives|wife)\b", re.I), "spouse"),
)
# "is an American actor", "is a 1957 Italian- American film": the capitalised words after the article.
_DESCRIBED = re.compile(
    r"\b(?:is|was|are|were)\s+(?:a|an|the)\s+(?:\d{4}s?\s+)?"
    r"(?P<run>[A-Z][\w'’.]*(?:(?:\s*-\s*|\s+)[A-Z][\w'’.]*)*)"
)
_DEMONYM = re.compile(r"(?:an|ian|ese|ish|ch|i|ic|ine|ene|ot|sh)$")
_DEMONYM_ALSO = frozenset({"Swiss", "Greek", "Soviet", "Filipino", "Slovak", "Uzbek", "Kazakh", "Tajik", "Zealand"})
_NOT_DEMONYM = frozenset({"Republican", "Christian", "Roman", "Catholic", "Anglican", "Lutheran", "Olympian"})


def _key(text: str) -> str:
    return normalize_answer(entity(text))


def date_key(text: str) -> tuple[int, int, int] | None:
    """(year, month, day) of one written date, 0 where the text does not say; None when it is no date."""
    m = DATE.fullmatch(text.strip())
    if m is None:
        return None
    year = date_year(m)
    month = next((m[g] for g in ("m1", "m2", "m3") if m[g]), None)
    day = next((m[g] for g in ("d1", "d2") if m[g]), None)
    return int(year), _MONTHS.index(month[:3].lower()) + 1 if month else 0, int(day) if day else 0


def date_year(m: re.Match[str]) -> str:
    """The year of a ``DATE`` match, as written."""
    return next(m[g] for g in ("y1", "y2", "y3", "y4") if m[g])


def earlier(a: str, b: str) -> int | None:
    """0 when date ``a`` is before ``b``, 1 when after; None when the dates cannot tell (equal, or one says
    only the year both share)."""
    ka, kb = date_key(a), date_key(b)
    if ka is None or kb is None:
        return None
    for x, y in zip(ka, kb, strict=True):
        if not x or not y:
            return None
        if x != y:
            return 0 if x < y else 1
    return None


def _first_date(text: str) -> str | None:
    m = DATE.search(text)
    return m[0] if m else None


def _unglue(text: str) -> str:
    """The corpus lost some ranges' dash: "( 6 December 180426 January 1860)", "(October 4, 1916May 5, 2002)"."""
    return re.sub(rf"(\d{{4}})(?=\d{{1,2}}\s+{_MONTH}|{_MONTH})", r"\1 ", text)


def life_dates(paragraph: str) -> tuple[str | None, str | None]:
    """(birth, death) as the paragraph writes them: the parenthesis after the name ("( 23 March 1946 – 5 May
    2001 )": two dates are birth and death; "(born 12 May 1920)", "( died 11 November 875)"), else "born ..." /
    "died ..." in the text."""
    for inner in re.findall(r"\(([^()]*)\)", paragraph[:400]):
        dates = [m[0] for m in DATE.finditer(_unglue(inner))]
        if len(dates) >= 2:
            return dates[0], dates[1]
        if not dates:
            continue
        if re.search(r"\b(?:died|d\.)", inner):
            return None, dates[0]
        if re.search(r"\b(?:born|b\.)", inner):
            return dates[0], None
        break  # a lone date in the parenthesis: birth or death, the text does not say
    born = re.search(r"\bborn\b[^.;()]{0,40}?" + DATE.pattern, paragraph)
    died = re.search(r"\bdied\b[^.;()]{0,40}?" + DATE.pattern, paragraph)
    return (_first_date(born[0]) if born else None), (_first_date(died[0]) if died else None)


def release_date(paragraph: str) -> str | None:
    """ "is a 1952 American film" (2Wiki's triple: "1952"), else the date after "released"/"published"."""
    m = re.search(r"\b(?:is|was)\s+(?:a|an)\s+(\d{4})\b(?![\d'’s])", paragraph)
    if m:
        return m[1]
    m = re.search(r"\b(?:released|published|premiered)\b[^.;]{0,60}?" + DATE.pattern, paragraph)
    return _first_date(m[0]) if m else None


def founding_date(paragraph: str) -> str | None:
    m = re.search(
        r"\b(?:founded|established|formed|launched|created|incorporated|first issue|started|"
        r"published (?:from|between|since))\b[^.;]{0,60}?" + DATE.pattern,
        paragraph,
        re.I,
    )
    return _first_date(m[0]) if m else None


def nationalities(paragraph: str) -> list[str]:
    """The demonyms of the paragraph's first description ("is a 2007 Italian- American film" → Italian,
    American; "is a Japanese American dancer" → Japanese, American), as written; a birthplace's ("an
    Austrian- born American director") is no nationality."""
    m = _DESCRIBED.search(re.sub(r"\b[A-Z][\w'’]*\s*-\s*born\s+", "", paragraph))
    if m is None:
        return []
    out = []
    for part in re.split(r"\s*-\s*", m["run"]):
        words = part.split()
        if words and all(_demonym(w) for w in words):
            out.extend(words)
        elif words and _demonym(words[-1]):
            out.append(" ".join(words))  # "Puerto Rican", "East German", "New Zealand"
    return out


def _demonym(word: str) -> bool:
    return word not in _NOT_DEMONYM and (word in _DEMONYM_ALSO or bool(_DEMONYM.search(word)))


def value(relation: str, paragraph: str) -> str | None:
    """A birth, death, release or founding date as ``paragraph`` writes it; None for another relation."""
    if relation in ("date of birth", "date of death"):
        born, died = life_dates(paragraph)
        return born if relation == "date of birth" else died
    if relation == "publication date":
        return release_date(paragraph)
    if relation == "inception":
        return founding_date(paragraph)
    return None


def compared_relation(question: str) -> tuple[str, str] | None:
    """(the compared relation, ``early`` | ``late`` | ``same``) a comparison question asks about; None for a
    shape not read."""
    if _NOT_READ.search(question):
        return None
    relation = next((r for shape, r in _SHAPES if shape.search(question)), None)
    if relation is None:
        return None
    if relation == "country of citizenship":
        return relation, "same"
    early, late = EARLY.search(question), LATE.search(question)
    if bool(early) == bool(late):
        return None
    return relation, "early" if early else "late"


def paragraph_of(paragraphs: Mapping[str, str], title: str) -> str | None:
    """``title``'s paragraph in ``paragraphs`` (title → text), matched as written, else by its entity's key."""
    if title in paragraphs:
        return paragraphs[title]
    return next((p for t, p in paragraphs.items() if _key(t) == _key(title)), None)


def names(text: str, title: str) -> bool:
    """Whether ``text`` names ``title``'s entity, as whole words once normalised."""
    name = _key(title)
    return bool(name) and f" {name} " in f" {normalize_answer(text)} "


def without_names(question: str, titles: list[str]) -> str:
    """The question's shape: without the entities ``titles`` name ("The Last Of The Knucklemen" says nothing
    of which end is asked for)."""
    for title in titles:
        question = re.sub(re.escape(entity(title)), " ", question, flags=re.I)
    return question


def _bridges(compared: list[str], ends: list[str], paragraphs: Mapping[str, str]) -> list[str] | None:
    """Each compared entity's bridge: the end its paragraph names (one pairing only, else None)."""
    texts = [paragraph_of(paragraphs, t) or "" for t in compared]
    fits = [
        pairing
        for pairing in (ends, ends[::-1])
        if all(names(text, end) for text, end in zip(texts, pairing, strict=True))
    ]
    return list(fits[0]) if len(fits) == 1 else None


def _agrees(values: list[str], order: str, compared: list[str], golds: list[str]) -> bool:
    """Whether the dates imply the gold answer (the earlier one's entity for ``early``, else the later one's)."""
    which = earlier(values[0], values[1])
    if which is None:
        return False
    winner = compared[which if order == "early" else 1 - which]
    gold_keys = {_key(g) for g in golds} | {normalize_answer(g) for g in golds}
    return _key(winner) in gold_keys or normalize_answer(winner) in gold_keys


def nationality_values(texts: list[str], golds: list[str]) -> list[str] | None:
    """One nationality per entity, agreeing with a yes/no gold: a shared one for "yes", the first of each of
    two disjoint sets for "no"."""
    found = [nationalities(t) for t in texts]
    if not all(found):
        return None
    gold = {normalize_answer(g) for g in golds}
    shared = [n for n in found[0] if n in found[1]]
    if gold == {"yes"}:
        return [shared[0], shared[0]] if shared else None
    if gold == {"no"}:
        return None if shared else [found[0][0], found[1][0]]
    return None


def _values(relation: str, order: str, texts: list[str], compared: list[str], golds: list[str]):
    if order == "same":
        return nationality_values(texts, golds)
    values = [value(relation, t) for t in texts]
    if any(v is None for v in values) or not _agrees(values, order, compared, golds):
        return None
    return values


def paragraph_evidences(row: dict, paragraphs: Mapping[str, str]) -> list[list[str]] | None:
    """Evidence triples for a 2Wiki comparison / bridge_comparison row without them, read from ``paragraphs``
    (supporting title → paragraph text); None when the row has triples, is another type, its question or
    paragraphs are not read, or the values read do not imply its gold answer."""
    meta = row.get("metadata") or {}
    if meta.get("evidences"):
        return None
    qtype = question_type(row)
    question, golds = row["question"], [str(g) for g in row["golden_answers"]]
    titles = [str(t) for t in meta.get("supporting_titles") or []]
    compared = [t for t in titles if names(question, t)]
    if qtype not in ("comparison", "bridge_comparison") or len(compared) != 2:
        return None
    shape = without_names(question, compared)
    asked = compared_relation(shape)
    if asked is None:
        return None
    relation, order = asked
    if qtype == "comparison":
        if len(titles) != 2:
            return None
        texts = [paragraph_of(paragraphs, t) for t in compared]
        if any(t is None for t in texts):
            return None
        if relation == "country of citizenship" and (_WORK.search(shape) or all(_WORK.search(t[:200]) for t in texts)):
            relation = "country of origin"
        values = _values(relation, order, texts, compared, golds)
        return None if values is None else [[t, relation, v] for t, v in zip(compared, values, strict=True)]
    first_hop = next((r for pattern, r in _FIRST_HOP if pattern.search(shape)), None)
    ends = [t for t in titles if t not in compared]
    if first_hop is None or len(ends) != 2:
        return None
    bridges = _bridges(compared, ends, paragraphs)
    if bridges is None:
        return None
    texts = [paragraph_of(paragraphs, b) for b in bridges]
    if any(t is None for t in texts):
        return None
    values = _values(relation, order, texts, compared, golds)
    if values is None:
        return None
    ends_named = [entity(b) for b in bridges]
    hop1 = [[c, first_hop, n] for c, n in zip(compared, ends_named, strict=True)]
    return hop1 + [[n, relation, v] for n, v in zip(ends_named, values, strict=True)]
