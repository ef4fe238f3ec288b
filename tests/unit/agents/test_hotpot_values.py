"""agents.hotpot_values on hand-written HotpotQA comparison rows and paragraphs: one per question shape it reads,
rows whose values contradict the gold (no triples), and the bundled train split (held-out rows never get triples)."""

from __future__ import annotations

import dataclasses

from agents.datasets import HELDOUT, load_bundled, select_split
from agents.gold_paragraphs import with_paragraph_evidences
from agents.hotpot_values import count_range, hotpot_relation, names_gold, paragraph_evidences
from agents.plans import plan


def hotpot(question: str, golds: list[str], titles: list[str]) -> dict:
    meta = {"dataset": "hotpotqa", "type": "comparison", "supporting_titles": titles}
    return {"question": question, "golden_answers": golds, "metadata": meta}


def tasks(row: dict, evidences: list) -> list[tuple[str, tuple[str, ...]]]:
    row = {**row, "metadata": {**row["metadata"], "evidences": evidences}}
    return [(t.task, t.answers) for t in plan(row).tasks]


BORN = {
    "Arthur Conan Doyle": "Sir Arthur Ignatius Conan Doyle KStJ, DL (22 May 1859 – 7 July 1930) was a British writer.",
    "Penelope Lively": "Dame Penelope Margaret Lively DBE FRSL (born 17 March 1933) is a British writer.",
}


def test_born_first_takes_a_gold_that_names_the_person_in_full():
    question = "Who was born first, Arthur Conan Doyle or Penelope Lively?"
    row = hotpot(question, ["Arthur Ignatius Conan Doyle"], list(BORN))
    evidences = paragraph_evidences(row, BORN)
    assert evidences == [
        ["Arthur Conan Doyle", "date of birth", "22 May 1859"],
        ["Penelope Lively", "date of birth", "17 March 1933"],
    ]
    assert tasks(row, evidences) == [
        ("When was Arthur Conan Doyle born?", ("22 May 1859",)),
        ("When was Penelope Lively born?", ("17 March 1933",)),
    ]


def test_values_that_contradict_the_gold_give_no_triples():
    row = hotpot("Who was born first, Arthur Conan Doyle or Penelope Lively?", ["Penelope Lively"], list(BORN))
    assert paragraph_evidences(row, BORN) is None
    cases = {
        "Craig v. Boren": "Craig v. Boren, 429 U.S. 190 (1976) , was the first case in which ...",
        "United States v. Paramount Pictures, Inc.": "United States v. Paramount Pictures, Inc., 334 US 131 (1948) ...",
    }
    # HotpotQA's own gold, which the paragraphs contradict (1976 is not before 1948).
    question = "Which case came first, Craig v. Boren or United States v. Paramount Pictures, Inc.?"
    assert paragraph_evidences(hotpot(question, ["Craig v. Boren"], list(cases)), cases) is None
    assert paragraph_evidences(hotpot(question, ["United States v. Paramount Pictures, Inc."], list(cases)), cases)


def test_events_compare_the_year_of_their_first_date():
    paragraphs = {
        "Battle of Belleau Wood": "The Battle of Belleau Wood (1–26 June 1918) occurred during the German Spring Offensive.",
        "Battle of Peleliu": "The Battle of Peleliu was fought during World War II, from September to November 1944.",
    }
    question = "Which of these battles occurred earlier--the Battle of Peleliu or the Battle of Belleau Wood?"
    row = hotpot(question, ["The Battle of Belleau Wood"], list(paragraphs))
    evidences = paragraph_evidences(row, paragraphs)
    assert evidences == [
        ["Battle of Peleliu", "point in time", "1944"],
        ["Battle of Belleau Wood", "point in time", "1918"],
    ]
    assert tasks(row, evidences)[0] == ("When did Battle of Peleliu take place?", ("1944",))


def test_works_that_came_first_compare_their_description_year():
    paragraphs = {
        "Staten Island Catapult": "The Staten Island Catapult is a 2005 documentary about a disgruntled commuter.",
        "Frida, en trotjänarinna": "Frida, en trotjänarinna is a 1999 documentary film which originally aired over SVT.",
    }
    question = "Between the documentaries The Staten Island Catapult and Frida, en trotjänarinna which came first?"
    row = hotpot(question, ["Frida, en trotjänarinna"], list(paragraphs))
    assert paragraph_evidences(row, paragraphs) == [
        ["Staten Island Catapult", "publication date", "2005"],
        ["Frida, en trotjänarinna", "publication date", "1999"],
    ]


SPECIES = {
    "Aichryson": "Aichryson is a genus of about 15 species of succulent, subtropical plants.",
    "Polypodium": "Polypodium is a genus of 75–100 species of true ferns, widely distributed throughout the world.",
}


def test_more_species_compares_the_counts_as_written_ranges_included():
    row = hotpot("Which has more species, Aichryson or Polypodium?", ["Polypodium"], list(SPECIES))
    evidences = paragraph_evidences(row, SPECIES)
    assert evidences == [
        ["Aichryson", "number of species", "about 15 species"],
        ["Polypodium", "number of species", "75–100 species"],
    ]
    assert tasks(row, evidences)[1] == ("How many species does Polypodium have?", ("75–100 species",))
    fewer = hotpot("Which has fewer species, Aichryson or Polypodium?", ["Polypodium"], list(SPECIES))
    assert paragraph_evidences(fewer, SPECIES) is None
    assert count_range("a single species") == (1, 1) and count_range("seven species") == (7, 7)


def test_more_acts_and_studio_albums():
    operas = {
        "Tosca": "Tosca (] ) is an opera in three acts by Giacomo Puccini.",
        "Don Quichotte": 'Don Quichotte ("Don Quixote") is an opera in five acts by Jules Massenet.',
    }
    row = hotpot("Which opera has more acts, Don Quichotte or Tosca?", ["Don Quichotte"], list(operas))
    assert paragraph_evidences(row, operas) == [
        ["Don Quichotte", "number of acts", "five acts"],
        ["Tosca", "number of acts", "three acts"],
    ]
    bands = {
        "Candlelight Red": "Candlelight Red is a rock band. They have produced two studio albums and an EP.",
        "Motion City Soundtrack": "Motion City Soundtrack was an American rock band ... and released six studio albums.",
    }
    question = "Who has released more studio albums, Candlelight Red or Motion City Soundtrack?"
    assert paragraph_evidences(hotpot(question, ["Motion City Soundtrack"], list(bands)), bands)[1] == [
        "Motion City Soundtrack",
        "number of studio albums",
        "six studio albums",
    ]


def test_taller_takes_each_buildings_greatest_height_and_a_yes_no_asks_about_the_first_named():
    towers = {
        "Bertelsmann Building": "The former Bertelsmann Building is a 44-story, 733 foot (223 m) office tower.",
        "432 Park Avenue": "Originally proposed to be 1300 ft in 2011, the structure topped out at 1396 ft .",
    }
    row = hotpot("Which building is taller Bertelsmann Building or 432 Park Avenue?", ["432 Park Avenue"], list(towers))
    assert paragraph_evidences(row, towers) == [
        ["Bertelsmann Building", "height", "733 foot"],
        ["432 Park Avenue", "height", "1396 ft"],
    ]
    question = "Is the Bertelsmann Building taller than 432 Park Avenue?"
    assert paragraph_evidences(hotpot(question, ["no"], list(towers)), towers) is not None
    assert paragraph_evidences(hotpot(question, ["yes"], list(towers)), towers) is None


def test_same_nationality_reads_past_a_lowercase_compound():
    paragraphs = {
        "Halldór Laxness": "Halldór Kiljan Laxness (23 April 1902 – 8 February 1998) was a twentieth-century Icelandic writer.",
        "Timothy Leary": "Timothy Francis Leary (October 22, 1920 – May 31, 1996) was an American psychologist.",
    }
    question = "Were Halldór Laxness and Timothy Leary from the same country?"
    assert paragraph_evidences(hotpot(question, ["no"], list(paragraphs)), paragraphs) == [
        ["Halldór Laxness", "country of citizenship", "Icelandic"],
        ["Timothy Leary", "country of citizenship", "American"],
    ]
    assert paragraph_evidences(hotpot(question, ["yes"], list(paragraphs)), paragraphs) is None


def test_shapes_not_read():
    assert hotpot_relation("Are   and   both Opera composers ?") is None
    assert hotpot_relation("Which band,   or  , had more members?") is None
    assert hotpot_relation("Are both   and   located in the same province?") is None
    assert hotpot_relation("Which magazine is older,   or  ?") == ("inception", "early")
    # A bridge row, or a comparison the dataset gave triples, is not read.
    bridge = {**hotpot("Who was born first, Arthur Conan Doyle or Penelope Lively?", ["x"], list(BORN))}
    bridge["metadata"] = {**bridge["metadata"], "type": "bridge"}
    assert paragraph_evidences(bridge, BORN) is None


def test_a_gold_names_one_title_only():
    assert names_gold("Doug Liman", "Saul Metzstein", ['Douglas Eric "Doug" Liman'])
    assert not names_gold("Saul Metzstein", "Doug Liman", ['Douglas Eric "Doug" Liman'])
    assert not names_gold("Liman", "Doug Liman", ["Doug Liman"])  # holds both titles' words: says neither


def test_bundled_train_comparisons_get_a_plan_and_held_out_rows_none():
    records = load_bundled("hotpotqa-dev")
    read = [r for r in records if r.metadata.get("evidences_source") == "paragraphs"]
    assert read and all(r.split == "train" and r.metadata["type"] == "comparison" for r in read)
    comparisons = [r for r in select_split(records, "train") if r.metadata.get("type") == "comparison"]
    planned = [
        r
        for r in comparisons
        if plan({"question": r.question, "golden_answers": r.golden_answers, "metadata": r.metadata}).tasks
    ]
    assert len(comparisons) == 105 and len(planned) >= 24  # 26 of the 105 train comparisons when written
    # The same row held out keeps its metadata as the dataset has it.
    original = dataclasses.replace(
        read[0], metadata={k: v for k, v in read[0].metadata.items() if "evidences" not in k}
    )
    (held,) = with_paragraph_evidences([dataclasses.replace(original, split=HELDOUT)], "hotpotqa-dev")
    assert held.metadata is original.metadata and "evidences" not in held.metadata
    (train,) = with_paragraph_evidences([original], "hotpotqa-dev")
    assert train.metadata["evidences"] == read[0].metadata["evidences"] and "evidences" not in original.metadata
