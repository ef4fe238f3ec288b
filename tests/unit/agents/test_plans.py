"""agents.plans on hand-checked 2Wiki questions of every type: the sub-questions a planner delegates and each
one's expected result, made from the row alone (no model), and no plan for a held-out question."""

from __future__ import annotations

from agents.datasets import HELDOUT, PromptRecord, load_prompts, select_split
from agents.plans import bridge_phrase, plan, plan_for_record, question_type


def wiki(question: str, golds: list[str], titles: list[str], evidences=None, kind=None) -> dict:
    meta = {"dataset": "2wikimultihopqa", "type": kind, "supporting_titles": titles, "evidences": evidences}
    return {"question": question, "golden_answers": golds, "metadata": meta}


def tasks(row: dict) -> list[tuple[str, tuple[str, ...]]]:
    return [(t.task, t.answers) for t in plan(row).tasks]


def test_compositional_without_triples_is_a_copy_edit_of_the_question():
    row = wiki(
        "Where was the director of film The Half-Way Girl born?",
        ["New York", "New York City"],
        ["John Francis Dillon (director)", "The Half-Way Girl"],
    )
    assert question_type(row) == "compositional"
    assert tasks(row) == [
        ("Who is the director of film The Half-Way Girl?", ("John Francis Dillon",)),
        ("Where was John Francis Dillon born?", ("New York", "New York City")),
    ]
    # The nearest relation is the bridge: "the place of birth of [the director of film X]".
    nested = wiki(
        "What is the place of birth of the director of film Preston Tylk?",
        ["Kearney"],
        ["Preston Tylk", "Jon Bokenkamp"],
    )
    assert tasks(nested) == [
        ("Who is the director of film Preston Tylk?", ("Jon Bokenkamp",)),
        ("What is the place of birth of Jon Bokenkamp?", ("Kearney",)),
    ]


def test_compositional_possessive_and_a_disambiguation_the_question_keeps():
    # "Sophie Gurney's" normalises to "sophie gurneys": the name is found in the raw text.
    row = wiki(
        "What is the cause of death of Sophie Gurney's father?",
        ["suicide"],
        ["Jacques Raverat", "Sophie Gurney"],
    )
    assert tasks(row) == [
        ("Who is Sophie Gurney's father?", ("Jacques Raverat",)),
        ("What is the cause of death of Jacques Raverat?", ("suicide",)),
    ]
    song = wiki(
        "Where was the place of death of the performer of song All Systems Go (Song)?",
        ["Naples"],
        ["All Systems Go (song)", "Donna Summer"],
    )
    assert tasks(song)[1] == ("Where was the place of death of Donna Summer?", ("Naples",))
    q = "Where was the performer of song All Systems Go (Song) born?"
    s, e = bridge_phrase(q, "All Systems Go (song)")
    assert q[s:e] == "the performer of song All Systems Go (Song)"


def test_compositional_with_triples_takes_the_bridge_entity_from_them():
    row = wiki(
        "Where was the director of film Hatchet Ii born?",
        ["Holliston"],
        ["Hatchet II", "Adam Green (filmmaker)"],
        [["Hatchet II", "director", "Adam Green"], ["Adam Green", "place of birth", "Holliston"]],
        "compositional",
    )
    assert tasks(row) == [
        ("Who is the director of film Hatchet Ii?", ("Adam Green",)),
        ("Where was Adam Green born?", ("Holliston",)),
    ]


def test_inference_through_the_kinship_map_and_through_triples():
    row = wiki(
        "Who is the mother-in-law of Ramiro Sánchez?",
        ["Jimena Díaz"],
        ["Ramiro Sánchez", "Cristina Rodríguez"],
    )
    assert question_type(row) == "inference"
    assert tasks(row) == [
        ("Who is the spouse of Ramiro Sánchez?", ("Cristina Rodríguez",)),  # mother-in-law = spouse's mother
        ("Who is the mother of Cristina Rodríguez?", ("Jimena Díaz",)),
    ]
    possessive = wiki(
        "Who is Jan Iii Of Oświęcim's paternal grandfather?",
        ["Jan I the Scholastic"],
        ["Jan III of Oświęcim", "Jan II of Oświęcim"],
    )
    assert [t for t, _ in tasks(possessive)] == [
        "Who is the father of Jan Iii Of Oświęcim?",
        "Who is the father of Jan II of Oświęcim?",
    ]
    # An uncle is a father's or a mother's sibling: only the triples say which.
    uncle = wiki("Who is Tlilpotoncatzin's uncle?", ["Chimalpopoca"], ["Tlilpotoncatzin", "Tlacaelel"])
    assert plan(uncle).tasks == ()
    uncle["metadata"]["evidences"] = [
        ["Tlilpotoncatzin", "father", "Tlacaelel"],
        ["Tlacaelel", "sibling", "Chimalpopoca"],
    ]
    assert tasks(uncle) == [
        ("Who is the father of Tlilpotoncatzin?", ("Tlacaelel",)),
        ("Who is the sibling of Tlacaelel?", ("Chimalpopoca",)),
    ]


def test_comparison_asks_each_entity_as_the_question_writes_it():
    row = wiki(
        "Which film was released first, The Clown Murders or Paadha Kaanikkai?",
        ["Paadha Kaanikkai"],
        ["Paadha Kaanikkai", "The Clown Murders"],
        [["The Clown Murders", "publication date", "1976"], ["Paadha Kaanikkai", "publication date", "1962"]],
        "comparison",
    )
    assert tasks(row) == [
        ("When was The Clown Murders released?", ("1976",)),
        ("When was Paadha Kaanikkai released?", ("1962",)),
    ]


def test_bridge_comparison_is_four_tasks_two_hops_for_each_film():
    row = wiki(
        "Which film has the director born first, Spione or Five Million Look For An Heir?",
        ["Five Million Look For An Heir"],
        ["Spione", "Fritz Lang", "Five Million Look for an Heir", "Carl Boese"],
        [
            ["Spione", "director", "Fritz Lang"],
            ["Five Million Look for an Heir", "director", "Carl Boese"],
            ["Fritz Lang", "date of birth", "December 5, 1890"],
            ["Carl Boese", "date of birth", "26 August 1887"],
        ],
        "bridge_comparison",
    )
    assert tasks(row) == [
        ("Who is the director of Spione?", ("Fritz Lang",)),
        ("Who is the director of Five Million Look For An Heir?", ("Carl Boese",)),
        ("When was Fritz Lang born?", ("December 5, 1890",)),
        ("When was Carl Boese born?", ("26 August 1887",)),
    ]


def test_a_held_out_question_never_gets_a_plan():
    row = wiki(
        "Where was the director of film The Half-Way Girl born?",
        ["New York"],
        ["John Francis Dillon (director)", "The Half-Way Girl"],
    )
    record = PromptRecord("q", row["question"], row["golden_answers"], split=HELDOUT, metadata=row["metadata"])
    assert plan_for_record(record) is None
    assert plan_for_record(PromptRecord("q", row["question"], ["New York"], split="train", metadata=row["metadata"]))
    # Every held-out 2Wiki question is refused, however plannable its row.
    held = select_split(load_prompts("bundled:2wiki-dev"), "eval")
    assert held and all(plan_for_record(r) is None for r in held)


def test_coverage_of_the_bundled_train_split():
    # The rules split nearly every compositional and inference question of 2Wiki's train split (the rest are
    # "the company that published X" and kinships like child-in-law that the words do not fix).
    rows = [
        {"question": r.question, "golden_answers": r.golden_answers, "metadata": r.metadata}
        for r in select_split(load_prompts("bundled:2wiki-dev"), "train")
    ]
    for kind, least in (("compositional", 0.95), ("inference", 0.9)):
        typed = [r for r in rows if question_type(r) == kind]
        split = [r for r in typed if (p := plan(r)) is not None and len(p.tasks) >= 2]
        assert len(split) >= least * len(typed), (kind, len(split), len(typed))
