"""make-sft's ``--hops supporting`` on hand-made rows: the hop plan read from a row's annotations, the two-search
(and two-delegation) demonstrations built from what a retriever returned for each query, and each one replayed
through its own agent: the rollout that writes the demonstrated actions builds the same ids and mask, parses the
same searches and answer, and scores the gold answer."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from agents import get_agent
from agents.base import Scoring
from agents.coda import reward as coda_reward
from agents.core.demonstrations import Style
from agents.core.turns import Budget
from agents.datasets import PromptRecord
from agents.plans import plan
from agents.prompts import PLANNER_SYSTEM, HFTokenizer, env_frame
from agents.search_r1 import reward as search_r1_reward
from shared.protocol.retrieval import RetrievedDocument
from tests.unit.agents.helpers import VLLMLikeGenerator, make_ctx, smol_template_folder
from tools.make_sft import build, coverage_lines


def doc(i: int, title: str, text: str) -> RetrievedDocument:
    return RetrievedDocument(id=str(i), contents=f'"{title}"\n{text}', score=1.0)


ADA = doc(1, "Ada Quill", "Ada Quill is a painter. She was born in Marrow.")
MARROW = doc(2, "Marrow (city)", "Marrow is a city on the Vessel River.")
PEN = doc(3, "Quill pen", "A quill is a writing tool made from a feather.")
RED = doc(4, "Red Kite", "Red Kite is a 1961 drama film directed by Tomas Vale.")
HERON = doc(5, "Blue Heron (film)", "Blue Heron is a 1950 film.")
VALE = doc(6, "Tomas Vale", "Tomas Vale was a film director. He was born in Lisbon.")
HERON_BY = doc(7, "Blue Heron (film)", "Blue Heron is a 1950 film directed by Ana Reis.")
VALE_1920 = doc(8, "Tomas Vale", "Tomas Vale was born in 1920.")
REIS = doc(9, "Ana Reis", "Ana Reis was born in 1910.")

# HotpotQA's layout: a type and the supporting titles, no triples.
BRIDGE = {
    "id": "b",
    "question": "What river flows through the city where Ada Quill was born?",
    "golden_answers": ["Vessel River"],
    "metadata": {"type": "bridge", "supporting_titles": ["Ada Quill", "Marrow (city)"]},
}
# 2Wiki's: the evidence triples say what each hop asks.
COMPARISON = {
    "id": "c",
    "question": "Which film came out first, Red Kite or Blue Heron?",
    "golden_answers": ["Blue Heron"],
    "metadata": {
        "type": "comparison",
        "supporting_titles": ["Blue Heron (film)", "Red Kite"],
        "evidences": [["Red Kite", "publication date", "1961"], ["Blue Heron", "publication date", "1950"]],
    },
}
COMPOSITIONAL = {
    "id": "d",
    "question": "Where was the director of film Red Kite born?",
    "golden_answers": ["Lisbon", "Lisboa"],
    "metadata": {
        "type": "compositional",
        "supporting_titles": ["Red Kite", "Tomas Vale"],
        "evidences": [["Red Kite", "director", "Tomas Vale"], ["Tomas Vale", "place of birth", "Lisbon"]],
    },
}
# Four hops: each film's director, then each director's birth date.
BRIDGE_COMPARISON = {
    "id": "e",
    "question": "Which film has the director born first, Red Kite or Blue Heron?",
    "golden_answers": ["Blue Heron"],
    "metadata": {
        "type": "bridge_comparison",
        "supporting_titles": ["Red Kite", "Tomas Vale", "Blue Heron (film)", "Ana Reis"],
        "evidences": [
            ["Red Kite", "director", "Tomas Vale"],
            ["Blue Heron", "director", "Ana Reis"],
            ["Tomas Vale", "date of birth", "1920"],
            ["Ana Reis", "date of birth", "1910"],
        ],
    },
}
FOUND = {
    BRIDGE["question"]: [ADA, PEN],
    "Marrow": [MARROW, PEN],
    COMPARISON["question"]: [RED, PEN],
    "Red Kite": [RED, PEN],
    "Blue Heron": [HERON, PEN],
    "When was Red Kite released?": [RED, PEN],
    "When was Blue Heron released?": [HERON, PEN],
    COMPOSITIONAL["question"]: [RED, PEN],
    "Who is the director of film Red Kite?": [RED, PEN],
    "Where was Tomas Vale born?": [VALE, PEN],
    "Who is the director of Red Kite?": [RED, PEN],
    "Who is the director of Blue Heron?": [HERON_BY, PEN],
    "When was Tomas Vale born?": [VALE_1920, PEN],
    "When was Ana Reis born?": [REIS, PEN],
}


class Retriever:
    """What a retriever returned, by query; make-sft calls it synchronously, the rollout awaits it."""

    def __init__(self, found: dict) -> None:
        self.found, self.queries = found, []

    def retrieve(self, queries, topk=None):
        self.queries += list(queries)
        return [self.found.get(q.strip(), [PEN]) for q in queries]


class AsyncRetriever(Retriever):
    async def retrieve(self, queries, topk=None):
        return super().retrieve(queries, topk)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return HFTokenizer(smol_template_folder(tmp_path_factory.mktemp("smol")), system_prompt="")


def trained_turns(tok, demo: dict) -> list[str]:
    """The demonstration's own turns (runs of trained tokens), EOS left out, as the policy would write them."""
    turns, run = [], []
    for t, m in zip(demo["token_ids"][:-1], demo["loss_mask"][:-1], strict=True):
        if m:
            run.append(t)
        elif run:
            turns, run = [*turns, tok.decode(run)], []
    return turns + ([tok.decode(run)] if run else [])


def observations(tok, demo: dict) -> list[str]:
    parts, run = [], []
    for t, m in zip(demo["token_ids"], demo["loss_mask"], strict=True):
        if not m:
            run.append(t)
        elif run:
            parts, run = [*parts, tok.decode(run)], []
    return parts[1:]  # the first untrained run is the prompt


# ---------------------------------------------------------------- the plan
def test_the_plan_reads_each_kind_of_question_from_its_row():
    bridge = plan(BRIDGE)
    # The bridge entity is the supporting title the question does not name, as running text names it.
    assert bridge.kind == "bridge" and bridge.queries == (BRIDGE["question"], "Marrow") and not bridge.tasks
    assert bridge.targets == (("Ada Quill",), ("Marrow (city)",))  # what each search must bring back
    comparison = plan(COMPARISON)
    assert comparison.queries == ("Red Kite", "Blue Heron")  # in the question's order, not the titles'
    assert [(t.task, t.answers) for t in comparison.tasks] == [
        ("When was Red Kite released?", ("1961",)),
        ("When was Blue Heron released?", ("1950",)),
    ]
    chain = plan(COMPOSITIONAL)
    assert chain.queries == (COMPOSITIONAL["question"], "Tomas Vale")
    # The second sub-question is asked about the first one's answer; its answer may be the gold's alias.
    assert [(t.task, t.answers) for t in chain.tasks] == [
        ("Who is the director of film Red Kite?", ("Tomas Vale",)),  # a copy of the question's words
        ("Where was Tomas Vale born?", ("Lisbon", "Lisboa")),  # the question, the phrase replaced
    ]
    # 2Wiki rows whose source dropped the type: both titles named = a comparison, one = a bridge.
    untyped = {**COMPARISON, "metadata": {"type": None, "supporting_titles": ["Red Kite", "Blue Heron (film)"]}}
    assert plan(untyped).kind == "comparison" and not plan(untyped).tasks
    assert plan({**BRIDGE, "metadata": {**BRIDGE["metadata"], "type": None}}).kind == "bridge"
    four = {
        "question": "Which film has the director born first, Red Kite or Blue Heron?",
        "golden_answers": ["Red Kite"],
        "metadata": {"type": None, "supporting_titles": ["Red Kite", "Tomas Vale", "Ana Reis", "Blue Heron (film)"]},
    }
    assert plan(four).kind == "bridge_comparison" and plan(four).queries == (four["question"], "Tomas Vale Ana Reis")


def test_no_plan_where_one_search_shows_everything():
    # The bridge entity is the answer: the first search already finds it.
    assert plan({**BRIDGE, "golden_answers": ["Marrow"]}) is None
    assert plan({**BRIDGE, "metadata": {"supporting_titles": ["Ada Quill"]}}) is None  # one title: one hop
    assert plan({"question": "Who?", "golden_answers": ["x"]}) is None  # the lookup world's rows


# ---------------------------------------------------------------- flat: two searches
def test_a_bridge_question_is_shown_with_two_searches_of_real_retrieved_documents(tok):
    retriever = Retriever(FOUND)
    (demo,) = build([BRIDGE], tok, retriever, topk=2, style=Style(think=False), hops="supporting")
    assert demo["queries"] == [BRIDGE["question"], "Marrow"] and demo["doc_ids"] == ["1", "3", "2", "3"]
    assert trained_turns(tok, demo) == [
        f"<search> {BRIDGE['question']} </search>",
        "<search> Marrow </search>",
        "<answer> Vessel River </answer>",
    ]
    first, second = observations(tok, demo)
    assert first.startswith('\n\n<information>Doc 1(Title: "Ada Quill") Ada Quill is a painter.')
    assert second == (
        '\n\n<information>Doc 1(Title: "Marrow (city)") Marrow is a city on the Vessel River.\n'
        'Doc 2(Title: "Quill pen") A quill is a writing tool made from a feather.\n</information>\n\n'
    )
    # The default stays one search of the question (the lookup world's recipes).
    (old,) = build([BRIDGE], tok, Retriever({**FOUND, BRIDGE["question"]: [ADA, MARROW]}), topk=2)
    assert old["queries"] == [BRIDGE["question"]] and "<search> Marrow </search>" not in trained_turns(tok, old)[0]


def test_a_second_search_that_misses_its_paragraph_falls_back_to_one_search(tok):
    # "Marrow" brings back no Marrow paragraph: two searches would show a hop that found nothing.
    found = {**FOUND, "Marrow": [PEN], BRIDGE["question"]: [ADA, MARROW]}
    (demo,) = build([BRIDGE], tok, Retriever(found), topk=2, hops="supporting")
    assert demo["queries"] == [BRIDGE["question"]]
    # Nothing supports the answer at all: no demonstration.
    assert build([BRIDGE], tok, Retriever({**found, BRIDGE["question"]: [ADA, PEN]}), topk=2, hops="supporting") == []


@pytest.mark.parametrize("env_turn", ["inline", "user"])
@pytest.mark.parametrize("row", [BRIDGE, COMPARISON], ids=["bridge", "comparison"])
async def test_a_two_search_demonstration_is_the_rollout_that_writes_it_and_scores_1(tok, env_turn, row):
    # Observations cut at 90 tokens (one per character here) in both: the second document is cut mid-text.
    style = Style(think=True, frame=env_frame(tok, env_turn), max_obs_tokens=90)
    (demo,) = build([row], tok, Retriever(FOUND), topk=2, style=style, hops="supporting")
    turns = trained_turns(tok, demo)
    ctx, _ = make_ctx(lambda prompt, model: "")
    ctx.tok, ctx.env_frame, ctx.topk, ctx.retriever = tok, style.frame, 2, AsyncRetriever(FOUND)
    ctx.policy = VLLMLikeGenerator(tok, lambda prompt: turns[len(ctx.policy.calls)])
    ctx.budgets["policy"] = Budget(max_turns=3, max_tokens=400, max_obs_tokens=90, max_context_tokens=20000)
    record = PromptRecord(prompt_id=row["id"], question=row["question"], golden_answers=row["golden_answers"])
    episode = await get_agent("search-r1").run(ctx, record)

    assert list(episode.search.queries) == demo["queries"] and len(demo["queries"]) == 2
    assert demo["token_ids"][:-1] == episode.main.ids and demo["loss_mask"][:-1] == episode.main.mask
    scored = search_r1_reward(episode, Scoring(record=record, settings=None, metric="f1"))
    assert scored.reward == 1.0 and scored.components["valid_format"] == 1.0


# ---------------------------------------------------------------- CoDA: a delegation per hop
# What each planner demonstration writes, by hand: a bridge's hops one per turn (hop 2 names hop 1's result), a
# comparison's two independent facts in one <task> block, one per line, answered in one turn of two <result>s.
PLANNER_TURNS = {
    "d": (
        [
            "<task> Who is the director of film Red Kite? </task>",
            "<task> Where was Tomas Vale born? </task>",
            "<answer> Lisbon </answer>",
        ],
        ["\n<result>Tomas Vale</result>\n", "\n<result>Lisbon</result>\n"],
    ),
    "c": (
        [
            "<task> When was Red Kite released?\nWhen was Blue Heron released? </task>",
            "<answer> Blue Heron </answer>",
        ],
        ["\n<result>1961</result>\n\n<result>1950</result>\n"],
    ),
    # Two turns of two: both directors, then both birth dates (a planner budget of 3 turns holds it).
    "e": (
        [
            "<task> Who is the director of Red Kite?\nWho is the director of Blue Heron? </task>",
            "<task> When was Tomas Vale born?\nWhen was Ana Reis born? </task>",
            "<answer> Blue Heron </answer>",
        ],
        [
            "\n<result>Tomas Vale</result>\n\n<result>Ana Reis</result>\n",
            "\n<result>1920</result>\n\n<result>1910</result>\n",
        ],
    ),
}


@pytest.mark.parametrize(
    "row", [COMPOSITIONAL, COMPARISON, BRIDGE_COMPARISON], ids=["compositional", "comparison", "bridge_comparison"]
)
async def test_the_planner_delegates_one_sub_question_per_hop_as_its_rollout_does(tok, row):
    demos = build([row], tok, Retriever(FOUND), topk=2, fmt="coda", style=Style(think=False), hops="supporting")
    *executors, planner = demos
    tasks = [t.task for t in plan(row).tasks]
    assert [d["role"] for d in demos] == ["executor"] * len(tasks) + ["planner"] and planner["queries"] == tasks
    answers = [e["answer"] for e in executors]
    written, results = PLANNER_TURNS[row["id"]]
    assert trained_turns(tok, planner) == written
    assert observations(tok, planner) == results
    for executor, task, answer in zip(executors, tasks, answers, strict=True):
        search, refine = trained_turns(tok, executor)
        assert search == f"<search> {task} </search>" and refine.endswith(f"<answer> {answer} </answer>")
        assert answer in refine.split("</refine>")[0]  # the sentence it quotes from its documents holds it

    by_task = {t: trained_turns(tok, e) for t, e in zip(tasks, executors, strict=True)}

    def script(prompt: str) -> str:
        if PLANNER_SYSTEM[:40] in prompt:  # the turns it has written so far: its </task>s past the instructions
            return trained_turns(tok, planner)[prompt.count("</task>") - PLANNER_SYSTEM.count("</task>")]
        task = next(t for t in tasks if f"Question: {t}" in prompt)
        return by_task[task][prompt.count("</documents>\n")]

    ctx, _ = make_ctx(lambda prompt, model: "")
    ctx.tok, ctx.topk, ctx.retriever = tok, 2, AsyncRetriever(FOUND)
    ctx.policy = VLLMLikeGenerator(tok, script)
    ctx.budgets.update(planner=Budget(max_turns=3, max_tokens=400), executor=Budget(max_turns=2, max_tokens=400))
    record = PromptRecord(prompt_id=row["id"], question=row["question"], golden_answers=row["golden_answers"])
    episode = await get_agent("coda").run(ctx, record)

    assert list(episode.facts.tasks) == tasks and list(episode.facts.executor_answers) == answers
    assert planner["token_ids"][:-1] == episode.main.ids and planner["loss_mask"][:-1] == episode.main.mask
    assert [e["token_ids"][:-1] for e in executors] == [c.ids for c in episode.children]
    settings = SimpleNamespace(format_weight=0.1, refine_weight=0.1)
    scored = coda_reward(episode, Scoring(record=record, settings=settings, metric="f1")).components
    assert scored["f1"] == 1.0 and scored["em"] == 1.0


def test_a_row_without_triples_still_delegates_its_question_whole(tok):
    demos = build([BRIDGE], tok, Retriever(FOUND), topk=2, fmt="coda", hops="supporting")
    assert demos == build([BRIDGE], tok, Retriever(FOUND), topk=2, fmt="coda")  # HotpotQA: as before


def test_a_planned_question_whose_hop_misses_gets_no_planner_demonstration(tok):
    # Hop 2's documents do not hold Lisbon: the executor of hop 1 is still shown, the planner is not, and the
    # question is not taught as one restated task instead.
    found = {**FOUND, "Where was Tomas Vale born?": [HERON, PEN]}
    coverage = Counter()
    demos = build([COMPOSITIONAL], tok, Retriever(found), topk=2, fmt="coda", hops="supporting", coverage=coverage)
    assert [d["role"] for d in demos] == ["executor"] and demos[0]["answer"] == "Tomas Vale"
    assert coverage[("compositional", "planned")] == 1 and coverage[("compositional", "dropped")] == 1
    assert coverage[("compositional", "restating")] == 0
    coverage = Counter()
    found = {**FOUND, BRIDGE["question"]: [ADA, MARROW]}  # HotpotQA's bridge: no sub-questions, one task
    build([COMPOSITIONAL, BRIDGE], tok, Retriever(found), topk=2, fmt="coda", hops="supporting", coverage=coverage)
    assert coverage[("compositional", "kept")] == 1 and coverage[("bridge", "restating")] == 1
    assert coverage_lines(coverage)[1].split() == ["bridge", "1", "0", "0", "0", "1", "0"]
