"""The hops of a multi-hop question, read from its row: what a two-search demonstration searches, and which
sub-questions a CoDA planner delegates, each with its expected result (make-sft's ``--hops supporting``; the
per-role reward scores each executor against its own sub-question's result).

Nothing here is written by a model: the plan comes from the dataset's own annotations, the supporting titles
(HotpotQA, 2Wiki), 2Wiki's evidence triples ``(subject, relation, object)`` where a row has them, and the
question's own words.

The flat agent's two searches (``queries``):
- **bridge** (HotpotQA ``bridge``, 2Wiki ``compositional``/``inference``): the question, then the bridge entity
  (the supporting title the question does not name; 2Wiki: the first triple's object). When the bridge entity is
  the answer itself the first paragraph already shows it: no plan.
- **comparison**: one search per compared entity, both named by the question.
- **bridge_comparison** (2Wiki, four titles): the question, then both bridge entities in one query.

The planner's sub-questions (``tasks``), grouped into planner turns (``HopPlan.turns``): a turn's sub-questions
do not depend on each other and share its one ``<task>`` block, one per line, run in parallel (a rollout's turn ends
at the first ``</task>``); a later turn's build on an earlier turn's results:
- **compositional**: a copy-edit of the question. The phrase that names the bridge ("the director of film The
  Half-Way Girl", "Sirikit's husband") becomes task 1 ("Who is the director of film The Half-Way Girl?"); task 2
  is the question with that phrase replaced by task 1's result ("Where was John Francis Dillon born?"). A small
  model learns copying words far sooner than paraphrasing them into a relation's template. Two turns of one task.
- **inference** (kinship): the relation split through ``KINSHIP`` (a paternal grandfather is the father's
  father, a mother-in-law the spouse's mother), or through the triples' own relations where a row has them.
- **comparison**: the compared fact of each entity ("When was Red Kite released?"), its result the triple's value
  (train rows without triples get them read from their gold paragraphs: 2Wiki's by ``agents.plan_values``,
  HotpotQA's by ``agents.hotpot_values``; else no tasks). One turn of two tasks.
- **bridge_comparison**: four tasks, two hops for each compared entity (its director, then the director's
  compared fact), from the triples: two turns of two tasks (both directors, then both compared facts), so a
  planner needs no more turns for it than for a bridge (the recipes' ``max_turns = 3``: two turns, the answer).
- **HotpotQA bridge** (no triples; the annotations do not say what links the hops): the same copy-edit where
  ``agents.hotpot_plans`` finds the phrase describing the bridge entity (an of-phrase, a relative clause, "<start>
  ... by an Italian physicist that ... since what year?"), checked to leave task 2 a question with no third hop:
  28 of the 198 bridge questions of the bundled train split; the rest keep no tasks.
A row with no tasks gets no planner demonstration that splits it; make-sft then writes the one-task
demonstration only for a question without a plan.

Held-out questions never get a plan at training time: ``plan_for_record`` refuses them, make-sft reads only the
train split, and the bench reads held-out annotations only to measure what an eval did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agents.answers import normalize_answer

BRIDGE_TYPES = frozenset({"bridge", "compositional", "inference"})
# 2Wiki's relations as a person would ask for them; any other relation r: "What is the r of X?".
RELATION_QUESTIONS = {
    "director": "Who is the director of {}?",
    "performer": "Who is the performer of {}?",
    "composer": "Who is the composer of {}?",
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
    "country of origin": "Which country is {} from?",
    "country": "Which country is {} in?",
    "educated at": "Where was {} educated?",
    "inception": "When was {} founded?",
    # HotpotQA comparisons' relations (agents.hotpot_values); none of them is a 2Wiki relation.
    "point in time": "When did {} take place?",
    "height": "How tall is {}?",
    "number of species": "How many species does {} have?",
    "number of acts": "How many acts does {} have?",
    "number of studio albums": "How many studio albums has {} released?",
}
# A kinship question's relation as two hops: (the first relation, then the second, of what the first found).
# Only relations whose path is fixed: an uncle is a father's or a mother's sibling, which the words do not say
# (such rows are split only where their triples give the path).
KINSHIP = {
    "paternal grandfather": ("father", "father"),
    "paternal grandmother": ("father", "mother"),
    "maternal grandfather": ("mother", "father"),
    "maternal grandmother": ("mother", "mother"),
    "father-in-law": ("spouse", "father"),
    "mother-in-law": ("spouse", "mother"),
    "stepmother": ("father", "spouse"),
    "stepfather": ("mother", "spouse"),
    "grandson": ("child", "child"),
    "granddaughter": ("child", "child"),
    "grandchild": ("child", "child"),
}
_KIN = r"(?:paternal |maternal )?(?:grand)?(?:father|mother|son|daughter|child|husband|wife|uncle|aunt|sibling|brother|sister|stepmother|stepfather)(?:-in-law)?"
_INFERENCE_SHAPES = (
    re.compile(rf"^who is (?P<x>.+?)'s? (?P<kin>{_KIN})\s*\?*$", re.IGNORECASE),
    re.compile(rf"^who is the (?P<kin>{_KIN}) of (?P<x>.+?)\s*\?*$", re.IGNORECASE),
)
# The words a question puts between a relation and the entity it is of ("the director of film X").
_OF_PHRASE = re.compile(
    r"(?:\bthe\s+)?(?:\b(?!(?:of|the|is|was|are|were|did|does|do|who|what|where|when|which|how)\b)[A-Za-z-]+\s+){1,3}"
    r"of\s+(?:(?:the\s+)?(?:film|song|movie|album|band|book|novel|show|"
    r"series|company|group|play|opera)\s+)?$",
    re.IGNORECASE,
)
_POSSESSIVE = re.compile(rf"^(?:'s|')\s+(?:{_KIN}|director|performer|composer|founder|creator)\b", re.IGNORECASE)
# Bridge phrases whose holder is not a person ("the country of ...").
_THINGS = frozenset(
    [
        "country",
        "city",
        "place",
        "company",
        "label",
        "university",
        "team",
        "school",
        "publisher",
        "language",
        "network",
        "station",
        "river",
    ]
)


@dataclass(frozen=True)
class SubQuestion:
    task: str  # what the planner writes in <task> (its executor searches it verbatim)
    answers: tuple[str, ...]  # its expected result, best first (make-sft takes one its documents hold)


@dataclass(frozen=True)
class HopPlan:
    kind: str  # bridge | comparison | bridge_comparison
    queries: tuple[str, str]  # the flat agent's two searches, in order
    targets: tuple[tuple[str, ...], tuple[str, ...]]  # the supporting titles each search is for
    tasks: tuple[SubQuestion, ...] = ()  # the planner's delegations, in order; () = none known

    @property
    def turns(self) -> tuple[tuple[SubQuestion, ...], ...]:
        """``tasks`` by planner turn: a bridge's hops one per turn (hop 2 asks about hop 1's result); a
        comparison's two facts in one turn; a bridge_comparison's first hops in one turn, their second hops in
        the next (``_bridge_comparison`` orders them so)."""
        if not self.tasks:
            return ()
        if self.kind == "bridge":
            return tuple((t,) for t in self.tasks)
        if self.kind == "comparison":
            return (self.tasks,)
        half = len(self.tasks) // 2
        return (self.tasks[:half], self.tasks[half:])


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


def question_type(row: dict) -> str:
    """The row's own type, else (2Wiki rows whose source dropped it) the type its shape gives."""
    from agents.datasets import wiki_type_from_shape

    meta = row.get("metadata") or {}
    if meta.get("type"):
        return str(meta["type"])
    titles = meta.get("supporting_titles") or []
    if meta.get("dataset") == "2wikimultihopqa" and titles:
        return wiki_type_from_shape(row["question"], len(titles))
    return "unknown"


def _kind(qtype: str, titles: list[str], question: str) -> str | None:
    if qtype == "bridge_comparison" or (qtype == "unknown" and len(titles) == 4):
        return "bridge_comparison" if len(titles) == 4 else None
    if len(titles) != 2:
        return None
    if qtype in BRIDGE_TYPES or qtype == "comparison":
        return "bridge" if qtype in BRIDGE_TYPES else "comparison"
    named = sum(_named(t, question) for t in titles)  # rows whose source gave no type
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


def _span(question: str, name: str) -> tuple[int, int] | None:
    """Where the question writes ``name`` (its case may differ: 2Wiki title-cases its questions)."""
    m = re.search(rf"(?<!\w){re.escape(name)}(?!\w)", question, re.IGNORECASE)
    return (m.start(), m.end()) if m else None


def _paren(question: str, end: int) -> int:
    """Past a disambiguation the question keeps after the name ("All Systems Go (Song)")."""
    m = re.match(r"\s*\([^()]*\)", question[end:])
    return end + m.end() if m else end


def bridge_phrase(question: str, start: str) -> tuple[int, int] | None:
    """The span of the phrase naming the bridge entity through ``start``: "the director of film X", "X's father"."""
    at = _span(question, entity(start))
    if at is None:
        return None
    s, e = at
    e = _paren(question, e)
    after = _POSSESSIVE.match(question[e:])
    if after:
        return s, e + after.end()
    before = _OF_PHRASE.search(question[:s])
    return (before.start(), e) if before else None


def _who(phrase: str) -> str:
    words = re.findall(r"[a-z]+", phrase.lower())
    head = words[words.index("of") - 1] if "of" in words and words.index("of") > 0 else (words[-1] if words else "")
    return f"{'What' if head in _THINGS else 'Who'} is {phrase}?"


def _compositional(question: str, start: str, bridge: str, golds: list[str]) -> tuple[SubQuestion, ...]:
    """The copy-edit split: task 1 asks for the bridge phrase, task 2 is the question with the phrase replaced
    by task 1's result."""
    span = bridge_phrase(question, start)
    if span is None:
        return ()
    s, e = span
    phrase = question[s:e].strip()
    first = phrase[0].lower() + phrase[1:] if phrase.lower().startswith("the ") else phrase
    second = (question[:s] + bridge + question[e:]).strip()
    return SubQuestion(_who(first), (bridge,)), SubQuestion(second, tuple(golds))


def _kinship(question: str, levels: list, bridge: str, golds: list[str]) -> tuple[SubQuestion, ...]:
    """A kinship question's two hops: the relations from the triples when a row has them, else ``KINSHIP``."""
    for shape in _INFERENCE_SHAPES:
        m = shape.match(question.strip())
        if m:
            break
    else:
        return ()
    subject = m["x"].strip()
    if len(levels) == 2 and len(levels[0]) == len(levels[1]) == 1:
        relations = (levels[0][0][1], levels[1][0][1])
    else:
        relations = KINSHIP.get(m["kin"].lower())
        if relations is None:
            return ()
    return (
        SubQuestion(question_for(relations[0], subject), (bridge,)),
        SubQuestion(question_for(relations[1], bridge), tuple(golds)),
    )


def _comparison(question: str, levels: list, compared: list[str]) -> tuple[SubQuestion, ...]:
    """Each compared entity's fact, as the question writes the entity; results from the triples."""
    if len(levels) != 1 or len(levels[0]) != 2:
        return ()
    facts = {_key(s): (r, o) for s, r, o in levels[0]}
    out = []
    for title in compared:
        fact = facts.get(_key(title))
        at = _span(question, entity(title))
        if fact is None or at is None:
            return ()
        out.append(SubQuestion(question_for(fact[0], question[at[0] : at[1]]), (fact[1],)))
    return tuple(out)


def _bridge_comparison(question: str, levels: list, compared: list[str]) -> tuple[SubQuestion, ...]:
    """Two hops per compared entity: its relation (director, ...) for each, then each found one's compared fact.
    Results from the triples."""
    if len(levels) != 2 or len(levels[0]) != 2 or len(levels[1]) != 2:
        return ()
    first = {_key(s): (r, o) for s, r, o in levels[0]}
    second = {_key(s): (r, o) for s, r, o in levels[1]}
    hop1, hop2 = [], []
    for title in compared:
        link, at = first.get(_key(title)), _span(question, entity(title))
        if link is None or at is None or _key(link[1]) not in second:
            return ()
        relation, value = second[_key(link[1])]
        hop1.append(SubQuestion(question_for(link[0], question[at[0] : at[1]]), (link[1],)))
        hop2.append(SubQuestion(question_for(relation, link[1]), (value,)))
    return (*hop1, *hop2)


def plan(row: dict) -> HopPlan | None:
    """The hop plan of a FlashRAG row (``question``, ``golden_answers``, ``metadata``), or None when the row
    is not a multi-hop question we can plan (the caller keeps its one-search demonstration)."""
    meta = row.get("metadata") or {}
    question, golds = row["question"].strip(), [str(g) for g in row["golden_answers"]]
    titles = [str(t) for t in meta.get("supporting_titles") or []]
    qtype = question_type(row)
    kind = _kind(qtype, titles, question)
    if kind is None:
        return None
    levels = _levels(meta.get("evidences") or [])
    tasks: tuple[SubQuestion, ...] = ()
    if kind == "comparison":
        first, second = _in_question_order(titles, question)
        queries, targets = (entity(first), entity(second)), ((first,), (second,))
        tasks = _comparison(question, levels, [first, second])
    elif kind == "bridge":
        # "Sophie Gurney's father" normalises to "sophie gurneys": look for the name in the raw text as well.
        named = [t for t in titles if _named(t, question) or _span(question, entity(t))]
        start = named[0] if len(named) == 1 else titles[0]
        end = next(t for t in titles if t != start)
        bridge = levels[0][0][2] if len(levels) == 2 else entity(end)
        if _key(bridge) in {_key(g) for g in golds}:
            return None
        queries, targets = (question, bridge), ((start,), (end,))
        if qtype == "inference":
            tasks = _kinship(question, levels, bridge, golds)
        elif meta.get("dataset") == "2wikimultihopqa" or levels:
            tasks = _compositional(question, start, bridge, golds)
            if not tasks and len(levels) == 2 and len(levels[0]) == len(levels[1]) == 1:
                (s1, r1, _), (_, r2, _) = levels[0][0], levels[1][0]
                tasks = (
                    SubQuestion(question_for(r1, s1), (bridge,)),
                    SubQuestion(question_for(r2, bridge), tuple(golds)),
                )
        elif meta.get("dataset") == "hotpotqa":
            from agents.hotpot_plans import hotpot_bridge  # imports this module's SubQuestion

            tasks = hotpot_bridge(question, start, bridge, golds)
    else:
        compared = [t for t in titles if _named(t, question)]
        if len(compared) != 2:
            return None
        compared = _in_question_order(compared, question)
        ends = [t for t in titles if t not in compared]
        bridges = [o for _, _, o in levels[0]] if len(levels) == 2 else [entity(t) for t in ends]
        queries, targets = (question, " ".join(bridges)), (tuple(compared), tuple(ends))
        tasks = _bridge_comparison(question, levels, compared)
    return HopPlan(kind, queries, targets, tasks)


def plan_for_record(record) -> HopPlan | None:
    """The plan of a rollout's ``PromptRecord``, for rewards that score each delegation against its own expected
    result; None for a held-out question (its annotations never reach training) or one without a plan."""
    from agents.datasets import HELDOUT

    if record.split == HELDOUT:
        return None
    row = {"question": record.question, "golden_answers": list(record.golden_answers), "metadata": record.metadata}
    return plan(row)
