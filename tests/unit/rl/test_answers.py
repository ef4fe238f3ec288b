"""agents.answers: normalisation and match scores, against values worked out by hand."""

import pytest

from agents.answers import (
    answer_scores,
    cover_exact_match,
    exact_match,
    extract_all_tags,
    extract_answer,
    extract_tag,
    gsm8k_target,
    normalize_answer,
    numeric_match,
    parse_number,
    sub_exact_match,
    token_f1,
)


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("The  Eiffel Tower!", "eiffel tower"),
        ("An apple, a day", "apple day"),
        ("  U.S.A. ", "usa"),
        ("theatre", "theatre"),  # "the" only as a whole word
        ("", ""),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_exact_match_max_over_golds_and_bare_string_gold():
    assert exact_match("the Beatles", ["Rolling Stones", "Beatles"]) == 1.0
    assert exact_match("Beatles", "beatles.") == 1.0  # a bare string is one gold, not characters
    assert exact_match("Beatle", ["Beatles"]) == 0.0


def test_sub_em_is_character_substring_cover_em_is_word_boundary():
    assert sub_exact_match("born in 1990", ["1"]) == 1.0
    assert cover_exact_match("born in 1990", ["1"]) == 0.0
    assert cover_exact_match("it was Paris, France", ["paris france"]) == 1.0
    assert cover_exact_match("party", ["art"]) == 0.0 and sub_exact_match("party", ["art"]) == 1.0


def test_empty_gold_never_matches():
    assert sub_exact_match("anything", ["the"]) == 0.0
    assert cover_exact_match("anything", ["!!"]) == 0.0


def test_token_f1_hand_computed():
    # pred tokens {barack, obama, jr}, gold {barack, obama}: same=2, P=2/3, R=1, F1=2·(2/3)/(5/3)=0.8
    assert token_f1("Barack Obama Jr.", ["Barack Obama"]) == pytest.approx(0.8)
    # repeated tokens count by multiset: pred "a b b", gold "b b b" -> "a" is an article... use words
    # pred "x y y", gold "y y y": same=2, P=2/3, R=2/3, F1=2/3
    assert token_f1("x y y", ["y y y"]) == pytest.approx(2 / 3)
    assert token_f1("nothing shared", ["other"]) == 0.0
    assert token_f1("Obama", ["nope", "Barack Obama"]) == pytest.approx(2 * 1 * 0.5 / 1.5)


def test_token_f1_yes_no_rule():
    assert token_f1("no", ["no way"]) == 0.0  # gold-side: pred is "no", differs -> 0, not 2/3
    assert token_f1("yes it is", ["yes"]) == 0.0
    assert token_f1("Yes.", ["yes"]) == 1.0
    assert token_f1("noanswer", ["noanswer", "x"]) == 1.0


def test_answer_scores_none_prediction():
    assert answer_scores(None, ["x"]) == {"em": 0.0, "sub_em": 0.0, "cover_em": 0.0, "f1": 0.0}
    s = answer_scores("Paris", ["paris"])
    assert s == {"em": 1.0, "sub_em": 1.0, "cover_em": 1.0, "f1": 1.0}


def test_extract_last_answer_and_min_matches():
    text = "<think>a</think><answer> first </answer> <answer>\nsecond\n</answer>"
    assert extract_answer(text) == "second"
    assert extract_tag("<answer>x</answer>", min_matches=2) is None
    assert extract_answer("<answer>unterminated") is None
    assert extract_all_tags("<refine>a</refine>x<refine> b</refine>", "refine") == ["a", " b"]


def test_numbers():
    assert parse_number("it costs $1,234.50 total") == 1234.5
    assert parse_number("from -3 to 7") == 7.0
    assert parse_number("none") is None
    assert gsm8k_target("so 5+5=10\n#### 1,000") == 1000.0
    assert gsm8k_target("no marker, answer 42") == 42.0
    assert numeric_match("The answer is 72.004", "72") == 1.0
    assert numeric_match("The answer is 72.02", 72) == 0.0
    assert numeric_match(None, 1) == 0.0
    assert numeric_match(3.0, "3", tol=1e-9) == 1.0
