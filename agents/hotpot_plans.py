"""HotpotQA bridge questions split into a planner's two sub-questions by copy-editing the question's own words.

HotpotQA's rows carry no triples: only the supporting titles, one of which the question names (the start) and
one it does not (the bridge entity). Its bridges are free-form, so a split is kept only where one of three
shapes finds the phrase that describes the bridge entity, tried in order:

- **of / possessive** (``agents.plans.bridge_phrase``): "The author of The Thing of It Is... is what
  nationality?" → "Who is the author of The Thing of It Is...?" | "William Goldman is what nationality?".
- **relative clause in place**: a noun phrase with its relative clause ("the woman who portrayed Corliss Archer
  in the film Kiss and Tell", "the city in which Kirton End is located") that runs to the question's end (or to
  the start's name and one last word: "When was the cricketer who debuted at the 2000 ICC KnockOut Trophy
  born?"), asks nothing itself, and names the start or follows it. Task 1 asks for the phrase; task 2 is the
  question with the phrase replaced by the bridge entity.
- **subject first**: "<start ...> was written by an Italian physicist that has worked in France since what
  year?" → "<start ...> was written by which Italian physicist?" | "Carlo Rovelli has worked in France since
  what year?": the determiner becomes "which", the relative clause gets the bridge entity as its subject.

A split is kept only when task 2 reads as a question (a wh-word or an auxiliary first, or a wh-word in place as
HotpotQA writes them: "... since what year?"), holds no further relative clause (a third hop: "the river that
drains into the sea near the castle that ..."), and the question does not already name the bridge entity.
Pure functions over strings: ``plan`` calls ``hotpot_bridge`` for HotpotQA's bridge rows; ``start_mentions``
checks a split against the row's paragraphs where a caller has them.
"""

from __future__ import annotations

import html
import re

from agents.answers import normalize_answer
from agents.plans import SubQuestion, bridge_phrase, entity

_WH = r"(?:what|which|who|whom|whose|when|where|why|how)"
_AUX = r"(?:is|are|was|were|do|does|did|has|have|had|can|could|will|would|should|may|might)"
# A determiner, up to five head words (no verb, preposition or determiner among them), a relative pronoun.
_STOP = r"(?:the|a|an|this|that|these|those|of|in|on|at|by|for|with|to|from|and|or|as|is|was|are|were|has|had|have|who|whom|whose|which|where|what|when)"
_HEAD_WORD = rf"(?!{_STOP}\b)[\w'’&.\-]+"
_RELATIVE = re.compile(
    rf"\b(?P<det>the|a|an|this)\s+(?P<head>(?:{_HEAD_WORD}\s+){{0,4}}{_HEAD_WORD}),?\s+"
    rf"(?P<rel>who|whom|that|which|where|(?:in|at|on|of|for|from|by|with|to)\s+(?:which|whom))\s+",
    re.IGNORECASE,
)
# The same without its pronoun: "a fitness magazine founded by who?" (task 2: "Shape was founded by who?").
_REDUCED = re.compile(
    rf"\b(?P<det>a|an|the|this)\s+(?P<head>(?:{_HEAD_WORD}\s+){{0,3}}{_HEAD_WORD})\s+"
    rf"(?P<rel>(?:\w+ed|known|born|written|made)(?=\s+(?:by|in|as|for|at|on)\b))",
    re.IGNORECASE,
)
_COPULA = re.compile(r"\b(?:is|was|are|were|be|been)\s*$", re.IGNORECASE)
_ASKS = re.compile(rf"\b{_WH}\b", re.IGNORECASE)
_DO = re.compile(r"\b(?:do|does|did)\s*$", re.IGNORECASE)
_STILL_RELATIVE = re.compile(r"\b(?:who|whom|whose|that)\s+\w", re.IGNORECASE)
# Heads that name a person when the relative pronoun ("that") does not say so.
_PEOPLE = frozenset(
    [
        "man",
        "woman",
        "person",
        "actor",
        "actress",
        "singer",
        "author",
        "writer",
        "director",
        "player",
        "cricketer",
        "footballer",
        "musician",
        "artist",
        "physicist",
        "politician",
        "producer",
        "composer",
        "rapper",
        "comedian",
        "boxer",
        "wrestler",
        "golfer",
        "king",
        "queen",
    ]
)


def _start_span(question: str, start: str) -> tuple[int, int] | None:
    """Where the question writes the start's name (titles keep HTML escapes: "Procter &amp; Gamble")."""
    name = html.unescape(entity(start))
    m = re.search(rf"(?<!\w){re.escape(name)}(?!\w)", question, re.IGNORECASE) if name else None
    return (m.start(), m.end()) if m else None


def reads_as_question(text: str) -> bool:
    """A wh-word or an auxiliary first, or a wh-word in place ("Carlo Rovelli has worked in France since what
    year?"), and a question mark last."""
    text = text.strip()
    if not text.endswith("?"):
        return False
    return bool(re.match(rf"{_WH}|{_AUX}\b", text, re.IGNORECASE) or _ASKS.search(text))


def _who(head: str, rel: str) -> str:
    person = rel.lower().endswith(("who", "whom")) or head.lower().split()[-1] in _PEOPLE
    return "Who" if person else "What"


def _lower_det(phrase: str) -> str:
    """The phrase as the middle of a question: "The arena where ..." → "the arena where ..."; "this song" →
    "the song" (task 1 is asked on its own, where "this" points at nothing)."""
    det, rest = phrase.split(" ", 1)
    return f"{'the' if det.lower() == 'this' else det.lower()} {rest}"


def _in_place(question: str, start: tuple[int, int], bridge: str) -> tuple[str, str] | None:
    """The relative-clause phrase replaced where it stands; its clause runs to the question's end or to the
    start's name and one last word ("born?"), and asks nothing itself."""
    body = question.rstrip().rstrip("?").rstrip()
    for m in _RELATIVE.finditer(body):
        ends = [len(body)]
        if start[1] > m.end() and len(body[start[1] :].split()) == 1:
            ends.insert(0, start[1])
        for end in ends:
            clause = body[m.end() : end]
            if _ASKS.search(clause) or not clause.strip():
                continue
            if not (m.start() <= start[0] < end or start[1] <= m.start()):
                continue
            phrase = body[m.start() : end].strip()
            if _STILL_RELATIVE.search(clause) or (end == len(body) and _DO.search(body[: m.start()])):
                continue  # a third hop ("the base, that ..."), or a main verb swallowed ("does the animal ... have")
            first = f"{_who(m['head'], m['rel'])} is {_lower_det(phrase)}?"
            return first, (question[: m.start()] + bridge + question[end:]).strip()
    return None


def _subject_first(question: str, start: tuple[int, int], bridge: str) -> tuple[str, str] | None:
    """ "<start> ... by an Italian physicist that has worked ... since what year?": task 1 ends at the head with
    "which" for its determiner, task 2 is the relative clause with the bridge entity for its subject."""
    body = question.rstrip().rstrip("?").rstrip()
    found = [m for m in _RELATIVE.finditer(body) if m["rel"].lower() in ("who", "that", "which")]
    for m in sorted([*found, *_REDUCED.finditer(body)], key=lambda m: m.start()):
        if m.start() < start[1] or _COPULA.search(body[: m.start()]):
            continue  # "ElvenQuest is a comic fantasy broadcast that ...": the start itself, not a bridge
        clause = body[m.end() :].strip()
        if not _ASKS.search(clause):
            continue
        if m.re is _REDUCED:
            clause = f"was {m['rel']} {clause}"
        return f"{question[: m.start()]}which {m['head']}?", f"{bridge} {clause}?"
    return None


def hotpot_bridge(question: str, start: str, bridge: str, golds: list[str]) -> tuple[SubQuestion, ...]:
    """A HotpotQA bridge question's two sub-questions (task 1's result: the bridge entity; task 2's: the golds),
    or () when no shape finds the phrase describing the bridge entity or the split fails its checks."""
    question = question.strip()
    at = _start_span(question, start)
    asked = set(normalize_answer(question).split())
    if at is None or set(normalize_answer(bridge).split()) <= asked:
        return ()  # the question names the bridge ("Kasper Peter Schmeichel": the start was misread)
    split = None
    span = bridge_phrase(question, html.unescape(start))
    # The of-phrase names the bridge only as the question's subject or right after its wh-word ("Where was the
    # director of film X born?"); elsewhere it is the asked relation ("What was the nickname of X, boss to ...?").
    if span is not None and re.fullmatch(rf"\s*(?:{_WH}\s+{_AUX}\s+)?", question[: span[0]], re.IGNORECASE):
        s, e = span
        phrase = question[s:e].strip()
        head = re.sub(r"\s+of\b.*$|'s?\s.*$", "", phrase)
        first = f"{_who(head, '')} is {_lower_det(phrase) if phrase.lower().startswith('the ') else phrase}?"
        split = first, (question[:s] + bridge + question[e:]).strip()
        split = split if len(question[e:].rstrip("?").split()) <= 1 or not question[:s].strip() else None
    split = split if split and _kept(split[1]) else _in_place(question, at, bridge)
    split = split if split and _kept(split[1]) else _subject_first(question, at, bridge)
    if not split or not _kept(split[1]):
        return ()
    first, second = (re.sub(r"\s+", " ", t).replace(" ?", "?") for t in split)
    return SubQuestion(first, (bridge,)), SubQuestion(second, tuple(golds))


def _kept(second: str) -> bool:
    return reads_as_question(second) and not _STILL_RELATIVE.search(second)


def start_mentions(start_paragraph: str, bridge: str) -> bool:
    """Whether the start's paragraph names the bridge entity: the first hop's search can find it there (a
    split whose start paragraph does not is a guess at the link)."""
    name = normalize_answer(entity(bridge))
    return bool(name) and f" {name} " in f" {normalize_answer(start_paragraph)} "
