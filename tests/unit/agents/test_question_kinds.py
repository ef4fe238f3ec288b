"""agents.question_kinds on hand-checked questions from the bundled 2Wiki and HotpotQA dev sets: which are choices
(yes/no, or an answer the question names), the candidates each names, and the reading-free guess."""

from __future__ import annotations

import pytest

from agents.question_kinds import candidates, guess, question_kind

# (question, golds, kind, candidates): copied from data/2wiki-dev/qa.jsonl and data/hotpotqa-dev/qa.jsonl.
EXAMPLES = [
    ("Which film was released first, On Body And Soul or Pearl Lust?", ["Pearl Lust"], "choice",
     ["On Body And Soul", "Pearl Lust"]),
    ("Was Ausaf Ali or Steven Perry born first?", ["Ausaf Ali"], "choice", ["Ausaf Ali", "Steven Perry"]),
    ("Who was born first out of Erick Chipeta and Praveen Agrawal?", ["Praveen Agrawal"], "choice",
     ["Erick Chipeta", "Praveen Agrawal"]),
    ("Are both Cunaú River and Rio Verde (Mato Grosso Do Sul) located in the same country?", ["yes"], "choice", []),
    ("Are the Laleli Mosque and Esma Sultan Mansion located in the same neighborhood?", ["no"], "choice", []),
    ("What is the place of birth of the performer of song Changed It?", ["Port of Spain", "Port-of-Spain"], "open",
     []),
    ("What is the place of birth of the director of film A Chrysanthemum Bursts In Cincoesquinas?",
     ["Buenos Aires", "Buenos Aires, Argentina"], "open", []),
]  # fmt: skip


@pytest.mark.parametrize(("question", "golds", "kind", "named"), EXAMPLES)
def test_kind_and_candidates_of_real_questions(question, golds, kind, named):
    assert question_kind(question, golds) == kind
    assert candidates(question) == named


def test_the_guess_is_the_first_candidate_else_yes():
    assert guess("Which film was released first, On Body And Soul or Pearl Lust?") == "On Body And Soul"
    assert guess("Who was born first out of Erick Chipeta and Praveen Agrawal?") == "Erick Chipeta"
    assert guess("Are the Laleli Mosque and Esma Sultan Mansion located in the same neighborhood?") == "yes"
    assert guess("What is the place of birth of the performer of song Changed It?") == "yes"  # names nothing


def test_a_gold_is_matched_as_a_whole_normalised_run_of_words():
    # "Perry" alone is not the gold "Steve Perry"; a gold that normalises to nothing ("The") names nothing.
    assert question_kind("Was Ausaf Ali or Steven Perry born first?", ["Steve Perry"]) == "open"
    assert question_kind("Who directed The Film?", ["The"]) == "open"
    assert question_kind("Was Ausaf Ali or Steven Perry born first?", ["a", "steven perry."]) == "choice"
