"""The hops of a multi-hop question, read from its row: what a two-search demonstration searches and which
sub-questions a CoDA planner delegates (make-sft's ``--hops supporting``).

Nothing here is written by a model: the plan comes from the dataset's own annotations, the supporting titles
(HotpotQA, 2Wiki) and, where 2Wiki has them, the evidence triples ``(subject, relation, object)``.

- **bridge** (HotpotQA ``bridge``, 2Wiki ``compositional``/``inference``): the first search is the question
  (the policy always has it), the second the bridge entity: the supporting title that the question does not
  name, as running text names it (2Wiki: the first triple's object), which the paragraph found first names.
  When the bridge entity is the answer itself, the first paragraph already shows it: no plan (make-sft keeps
  the one-search demonstration).
- **comparison**: one search per compared entity, both named by the question.
- **bridge_comparison** (2Wiki, four titles): the question (it names both compared entities), then both
  bridge entities in one query: the flat agent's turn budget (3) leaves room for two searches and the answer.

Sub-questions need the relation between hops, which only 2Wiki's triples give: a chain ``A -r1-> B -r2-> C``
becomes ``Who directed A?`` then ``Where was B born?`` (the second built on the first's answer), a comparison
one sub-question per compared entity. One per planner turn: the rollout ends a turn at the first ``</task>``,
and the planner's budget (3 turns) holds two delegations and the answer, so a bridge_comparison (four facts)
gets none. A row without triples gets no sub-questions (its CoDA demonstration delegates the question whole,
as before): HotpotQA's annotations do not say what links its hops, and cutting the question at its relative
clause ("... held by [the woman who portrayed ...]") parsed 7 of its 107 bridge questions that name one
supporting title.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from recipes.answers import normalize_answer

BRIDGE_TYPES = frozenset({"bridge", "compositional", "inference"})
# 2Wiki's relations as a person would ask for them; any other relation r: "What is the r of X?".
RELATION_QUESTIONS = {
    "director": "Who directed {}?",
    "performer": "Who performed {}?",
    "composer": "Who composed {}?",
    "founded by": "Who founded {}?",
    "father": "Who is the father of {}?",
    "mother": "Who is the mother of {}?",
    "spouse": "Who is the spouse of {}?",
    "sibling": "Who is the sibling of {}?",
    "child": "Who is the child of {}?",
    "date of birth": "When was {} born?",
    "date of death": "When did {} die?",
    "place of birth": "Where was {} born?",
    "place of death": "Where did {} die?",
    "place of burial": "Where was {} buried?",
    "publication date": "When was {} released?",
    "country of citizenship": "What is the nationality of {}?",
    "educated at": "Where was {} educated?",
}


@dataclass(frozen=True)
class SubQuestion:
    task: str  # what the planner writes in <task> (its executor searches it verbatim)
    answers: tuple[str, ...]  # what the executor may answer, best first (make-sft takes one its documents hold)


@dataclass(frozen=True)
class HopPlan:
    kind: str  # bridge | comparison | bridge_comparison
    queries: tuple[str, str]  # the flat agent's two searches, in order
    targets: tuple[tuple[str, ...], tuple[str, ...]]  # the supporting titles each search is for
    tasks: tuple[SubQuestion, ...] = ()  # the planner's delegations, one per turn; () = none known


def entity(title: str) -> str:
    """A title as running text names it: without Wikipedia's disambiguation (``Winner (band)`` → ``Winner``)."""
    return re.sub(r"\s*\([^()]*\)$", "", title).strip()


def _key(text: str) -> str:
    return normalize_answer(entity(text))


def _named(title: str, question: str) -> bool:
    name = _key(title)
    return bool(name) and f" {name} " in f" {normalize_answer(question)} "


def _in_question_order(names: list[str], question: str) -> list[str]:
    text = normalize_answer(question)
    return sorted(names, key=lambda n: text.find(_key(n)) if _key(n) in text else len(text))


def _kind(meta: dict, titles: list[str], question: str) -> str | None:
    kind = meta.get("type")
    if kind == "bridge_comparison" or (kind is None and len(titles) == 4):
        return "bridge_comparison" if len(titles) == 4 else None
    if len(titles) != 2:
        return None
    if kind in BRIDGE_TYPES or kind == "comparison":
        return "bridge" if kind in BRIDGE_TYPES else "comparison"
    named = sum(_named(t, question) for t in titles)  # 2Wiki rows whose source dropped the type
    return {2: "comparison", 1: "bridge"}.get(named)


def question_for(relation: str, subject: str) -> str:
    return RELATION_QUESTIONS.get(relation, f"What is the {relation} of {{}}?").format(subject)


def _levels(evidences: list) -> list[list[tuple[str, str, str]]]:
    """The triples by hop: first those about an entity the question names, then those about an entity a
    first-hop triple found; [] when they are not such a two-level chain."""
    triples = [(str(s), str(r), str(o)) for s, r, o in evidences]
    found = {_key(o) for _, _, o in triples}
    first = [t for t in triples if _key(t[0]) not in found]
    second = [t for t in triples if _key(t[0]) in found]
    first_objects = {_key(o) for _, _, o in first}
    if not first or any(_key(s) not in first_objects for s, _, _ in second):
        return []
    return [first, second] if second else [first]


def _tasks(levels: list[list[tuple[str, str, str]]], golds: list[str], kind: str) -> tuple[SubQuestion, ...]:
    """A bridge: the first hop's fact, then the second's about the entity it found; the last answer may be
    said as the gold or one of its aliases. A comparison: the compared fact of each entity."""
    shapes = [len(level) for level in levels]
    if kind == "bridge" and shapes == [1, 1]:
        (s1, r1, o1), (_, r2, o2) = levels[0][0], levels[1][0]
        return (SubQuestion(question_for(r1, s1), (o1,)), SubQuestion(question_for(r2, o1), (o2, *golds)))
    if kind == "comparison" and shapes == [2]:
        return tuple(SubQuestion(question_for(r, s), (o,)) for s, r, o in levels[0])
    return ()


def plan(row: dict) -> HopPlan | None:
    """The hop plan of a FlashRAG row (``question``, ``golden_answers``, ``metadata``), or None when the row
    is not a two-hop question we can plan (the caller keeps its one-search demonstration)."""
    meta = row.get("metadata") or {}
    question, golds = row["question"].strip(), [str(g) for g in row["golden_answers"]]
    titles = [str(t) for t in meta.get("supporting_titles") or []]
    kind = _kind(meta, titles, question)
    if kind is None:
        return None
    levels = _levels(meta.get("evidences") or [])
    if kind == "comparison":
        first, second = _in_question_order(titles, question)
        queries, targets = (entity(first), entity(second)), ((first,), (second,))
    elif kind == "bridge":
        named = [t for t in titles if _named(t, question)]
        start = named[0] if len(named) == 1 else titles[0]
        end = next(t for t in titles if t != start)
        bridge = levels[0][0][2] if len(levels) == 2 else entity(end)
        if _key(bridge) in {_key(g) for g in golds}:
            return None
        queries, targets = (question, bridge), ((start,), (end,))
    else:
        compared = [t for t in titles if _named(t, question)]
        if len(compared) != 2:
            return None
        ends = [t for t in titles if t not in compared]
        bridges = [o for _, _, o in levels[0]] if len(levels) == 2 else [entity(t) for t in ends]
        queries, targets = (question, " ".join(bridges)), (tuple(compared), tuple(ends))
    return HopPlan(kind, queries, targets, _tasks(levels, golds, kind))


def plan_for_record(record) -> HopPlan | None:
    """The plan of a rollout's ``PromptRecord``, for rewards that score each delegation against its own expected
    result; None for a held-out question (its annotations never reach training) or one without a plan."""
    from recipes.datasets import HELDOUT

    if record.split == HELDOUT:
        return None
    row = {"question": record.question, "golden_answers": list(record.golden_answers), "metadata": record.metadata}
    return plan(row)
