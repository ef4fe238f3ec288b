"""agents.plan_values on hand-written 2Wiki rows and paragraphs: one per question shape it reads, the rows whose
values contradict the gold (no triples), and the bundled train split (held-out rows never get triples)."""

from __future__ import annotations

import dataclasses

from agents.datasets import HELDOUT, load_bundled, select_split
from agents.gold_paragraphs import with_paragraph_evidences
from agents.plan_values import date_key, earlier, life_dates, nationalities, paragraph_evidences
from agents.plans import plan, question_type


def wiki(question: str, golds: list[str], titles: list[str], kind: str | None = None) -> dict:
    meta = {"dataset": "2wikimultihopqa", "type": kind, "supporting_titles": titles, "evidences": None}
    return {"question": question, "golden_answers": golds, "metadata": meta}


def tasks(row: dict, evidences: list) -> list[tuple[str, tuple[str, ...]]]:
    row = {**row, "metadata": {**row["metadata"], "evidences": evidences}}
    return [(t.task, t.answers) for t in plan(row).tasks]


BORN = {
    "Jamie Curry": "Jamie Curry( born 12 May 1996) is an English comedian.",
    "Alyaksey Vasilewski": "Alyaksey Vasilewski( 23 March 1946 – 5 May 2001 ) was a Belarusian footballer.",
}


def test_born_first_reads_each_birth_date_as_written():
    row = wiki("Was Jamie Curry or Alyaksey Vasilewski born first?", ["Alyaksey Vasilewski"], list(BORN))
    evidences = paragraph_evidences(row, BORN)
    assert evidences == [
        ["Jamie Curry", "date of birth", "12 May 1996"],
        ["Alyaksey Vasilewski", "date of birth", "23 March 1946"],
    ]
    assert tasks(row, evidences) == [
        ("When was Jamie Curry born?", ("12 May 1996",)),
        ("When was Alyaksey Vasilewski born?", ("23 March 1946",)),
    ]


def test_values_that_contradict_the_gold_give_no_triples():
    row = wiki("Who is older, Jamie Curry or Alyaksey Vasilewski?", ["Jamie Curry"], list(BORN))
    assert paragraph_evidences(row, BORN) is None
    younger = wiki("Who is younger, Jamie Curry or Alyaksey Vasilewski?", ["Jamie Curry"], list(BORN))
    assert paragraph_evidences(younger, BORN)[0] == ["Jamie Curry", "date of birth", "12 May 1996"]


def test_died_later_reads_the_range_end_and_dates_the_corpus_glued():
    paragraphs = {
        "Wilhelmine Schröder": "Wilhelmine Schröder( 6 December 180426 January 1860), was a German soprano.",
        "George Sidney": "George Sidney (October 4, 1916May 5, 2002) was an American film director.",
    }
    row = wiki("Who died later, Wilhelmine Schröder or George Sidney?", ["George Sidney"], list(paragraphs))
    assert paragraph_evidences(row, paragraphs) == [
        ["Wilhelmine Schröder", "date of death", "26 January 1860"],
        ["George Sidney", "date of death", "May 5, 2002"],
    ]


def test_released_first_reads_the_year_of_the_description_or_of_the_release():
    paragraphs = {
        "Pearl Lust": "Pearl Lust is a 1936 German drama film directed by Harry Piel.",
        "On Body and Soul": "On Body and Soul is a Hungarian drama film. It was released on March 2, 2017.",
    }
    row = wiki("Which film was released first, On Body And Soul or Pearl Lust?", ["Pearl Lust"], list(paragraphs))
    evidences = paragraph_evidences(row, paragraphs)
    assert evidences == [
        ["Pearl Lust", "publication date", "1936"],
        ["On Body and Soul", "publication date", "March 2, 2017"],
    ]
    assert tasks(row, evidences) == [
        ("When was On Body And Soul released?", ("March 2, 2017",)),
        ("When was Pearl Lust released?", ("1936",)),
    ]


def test_founded_first_is_inception():
    paragraphs = {
        "Racing Toward Diversity": "Racing Toward Diversity is an American magazine. It was founded in 2008.",
        "Lo Scolaro": "Lo Scolaro was a weekly magazine published from 1912 to 1972.",
    }
    row = wiki(
        "Which magazine was founded first, Racing Toward Diversity or Lo Scolaro?", ["Lo Scolaro"], list(paragraphs)
    )
    assert paragraph_evidences(row, paragraphs) == [
        ["Racing Toward Diversity", "inception", "2008"],
        ["Lo Scolaro", "inception", "1912"],
    ]


def test_same_nationality_needs_a_shared_one_for_yes_and_none_for_no():
    paragraphs = {
        "Ailes Gilmour": "Ailes Gilmour (January 27, 1912 - April 16, 1993) was a Japanese American dancer.",
        "Chris Schwinden": "Christopher Schwinden( born September 22, 1986) is an American former baseball pitcher.",
    }
    question = "Are Ailes Gilmour and Chris Schwinden of the same nationality?"
    assert paragraph_evidences(wiki(question, ["yes"], list(paragraphs)), paragraphs) == [
        ["Ailes Gilmour", "country of citizenship", "American"],
        ["Chris Schwinden", "country of citizenship", "American"],
    ]
    assert paragraph_evidences(wiki(question, ["no"], list(paragraphs)), paragraphs) is None


def test_films_from_the_same_country_is_their_origin():
    paragraphs = {
        "Naked Tango": "Naked Tango is a 1991 Argentine- American drama film written by Leonard Schrader.",
        "Algiers (film)": "Algiers is a 1938 American drama film directed by John Cromwell.",
    }
    row = wiki("Are both movies, Naked Tango and Algiers (Film), from the same country?", ["yes"], list(paragraphs))
    assert paragraph_evidences(row, paragraphs) == [
        ["Naked Tango", "country of origin", "American"],
        ["Algiers (film)", "country of origin", "American"],
    ]
    differ = wiki("Are both movies, Naked Tango and Algiers (Film), from the same country?", ["no"], list(paragraphs))
    assert paragraph_evidences(differ, paragraphs) is None  # they share American: "no" contradicts them


FILMS = {
    "Three Violent People": "Three Violent People is a 1957 American Western film directed by Rudolph Maté.",
    "Girls in White": "Girls in White is a 1936 German musical comedy film directed by Victor Janson.",
    "Rudolph Maté": "Rudolph Maté( 21 January 1898 – 27 October 1964) was a Polish- Hungarian- American director.",
    "Victor Janson": "Victor Arthur Eduard Janson( 25 September 1884 – 29 June 1960) was a Latvian- born German actor.",
}


def test_bridge_comparison_finds_each_films_director_in_its_paragraph():
    question = "Which film has the director who died first, Three Violent People or Girls In White?"
    row = wiki(question, ["Girls In White"], list(FILMS), kind="bridge_comparison")
    evidences = paragraph_evidences(row, FILMS)
    assert evidences == [
        ["Three Violent People", "director", "Rudolph Maté"],
        ["Girls in White", "director", "Victor Janson"],
        ["Rudolph Maté", "date of death", "27 October 1964"],
        ["Victor Janson", "date of death", "29 June 1960"],
    ]
    assert tasks(row, evidences) == [
        ("Who is the director of Three Violent People?", ("Rudolph Maté",)),
        ("Who is the director of Girls In White?", ("Victor Janson",)),
        ("When did Rudolph Maté die?", ("27 October 1964",)),
        ("When did Victor Janson die?", ("29 June 1960",)),
    ]
    wrong = wiki(question, ["Three Violent People"], list(FILMS), kind="bridge_comparison")
    assert paragraph_evidences(wrong, FILMS) is None


def test_bridge_comparison_nationality_skips_a_birthplace():
    question = "Are director of film Three Violent People and director of film Girls In White from the same country?"
    row = wiki(question, ["no"], list(FILMS), kind="bridge_comparison")
    assert question_type(row) == "bridge_comparison"
    assert paragraph_evidences(row, FILMS)[2:] == [
        ["Rudolph Maté", "country of citizenship", "Polish"],
        ["Victor Janson", "country of citizenship", "German"],
    ]


def test_a_title_with_an_order_word_does_not_decide_the_order():
    paragraphs = {
        "The Last Man": "The Last Man is a 1924 German film.",
        "Red Kite": "Red Kite is a 1961 British film.",
    }
    row = wiki("Which film came out first, The Last Man or Red Kite?", ["The Last Man"], list(paragraphs))
    assert paragraph_evidences(row, paragraphs)[0] == ["The Last Man", "publication date", "1924"]


def test_shapes_and_rows_not_read():
    lived = wiki("Who lived longer, Jamie Curry or Alyaksey Vasilewski?", ["Alyaksey Vasilewski"], list(BORN))
    assert paragraph_evidences(lived, BORN) is None  # two facts per entity: no one-fact comparison plan
    has = wiki("Was Jamie Curry or Alyaksey Vasilewski born first?", ["Alyaksey Vasilewski"], list(BORN))
    has["metadata"]["evidences"] = [["Jamie Curry", "date of birth", "1996"]]
    assert paragraph_evidences(has, BORN) is None  # the dataset's own triples stand
    same_year = {"A Kite": "A Kite is a 1961 film.", "B Kite": "B Kite is a 1961 film."}
    row = wiki("Which film came out first, A Kite or B Kite?", ["A Kite"], list(same_year))
    assert paragraph_evidences(row, same_year) is None  # the years cannot tell


def test_dates_and_descriptions():
    assert date_key("November 22, 1917") == (1917, 11, 22)
    assert date_key("1952") == (1952, 0, 0)
    assert earlier("1952", "3 May 1960") == 0
    assert earlier("1952", "3 May 1952") is None
    assert life_dates("Cristina( born c. 1075) was a daughter of El Cid.") == ("1075", None)
    assert life_dates("El Cid (10 July 1099) was a Castilian knight.") == (None, None)
    assert nationalities("Fred Zinnemann was an Austrian- born American film director.") == ["American"]
    assert nationalities("Ramón Hernández is a Puerto Rican volleyball coach.") == ["Puerto Rican"]


def test_bundled_train_comparisons_without_triples_get_a_plan_and_held_out_rows_none():
    records = load_bundled("2wiki-dev")
    read = [r for r in records if r.metadata.get("evidences_source") == "paragraphs"]
    assert read and all(r.split == "train" for r in read)
    planned = [
        r
        for r in select_split(records, "train")
        if r.metadata.get("evidences_source") == "paragraphs"
        and plan({"question": r.question, "golden_answers": r.golden_answers, "metadata": r.metadata}).tasks
    ]
    assert len(planned) >= 160  # 171 of the 203 train comparisons without triples when written
    # The same row held out keeps its metadata as the dataset has it.
    original = dataclasses.replace(read[0], metadata={**read[0].metadata, "evidences": None})
    del original.metadata["evidences_source"]
    (held,) = with_paragraph_evidences([dataclasses.replace(original, split=HELDOUT)])
    assert held.metadata is original.metadata and held.metadata["evidences"] is None
    (train,) = with_paragraph_evidences([original])
    assert train.metadata["evidences"] == read[0].metadata["evidences"] and original.metadata["evidences"] is None
