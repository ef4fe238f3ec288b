"""Answer, format and retrieval rewards on text, against hand-worked values."""

import pytest

from agents.answers import affine_answer_reward, answer_reward
from agents.core.turns import (
    is_valid_sequence,
    role_format_score,
    tag_format_score,
    validate_sequence,
)
from agents.rewards.retrieval import document_id, information_reverse_rank, mrr, reciprocal_rank, refine_score


def test_affine_mapping():
    assert affine_answer_reward(0.0) == -3.0
    assert affine_answer_reward(0.5) == 0.0
    assert affine_answer_reward(1.0) == 3.0


def test_answer_reward_components():
    r = answer_reward("Barack Obama Jr.", ["Barack Obama"], metric="f1")
    assert r.reward == pytest.approx(0.8)
    assert r.components["em"] == 0.0 and r.components["sub_em"] == 1.0 and r.components["has_answer"] == 1.0
    none = answer_reward(None, ["x"])
    assert none.reward == 0.0 and none.components["has_answer"] == 0.0


def test_graduated_format_score_per_role():
    executor = "<think>a</think><search>q</search><documents>d</documents><refine>r</refine><answer>x</answer>"
    assert role_format_score(executor, "executor") == 1.0
    # executor list has 4 tags: think + answer balanced, no search/refine -> 0.5
    assert role_format_score("<think>a</think><answer>x</answer>", "executor") == 0.5
    # planner list has 3 tags: think balanced, task unbalanced, answer missing -> 1/3
    assert role_format_score("<think>a</think><task>q", "planner") == pytest.approx(1 / 3)
    assert tag_format_score("<think></think><think>", ["think"]) == 0.0  # unbalanced
    assert tag_format_score("", []) == 0.0


def test_planner_scored_on_planner_tags_even_if_text_mentions_refine():
    # Upstream CoDA picked the executor list whenever "<refine>" appeared; we go by role.
    text = "<think>use <refine> later</think><task>who?</task><result>r</result><think>ok</think><answer>a</answer>"
    assert role_format_score(text, "planner") == 1.0


@pytest.mark.parametrize(
    ("text", "role", "valid"),
    [
        ("<think>a</think><answer>b</answer>", "policy", True),
        (
            "<think>a</think>\n<search>q</search>\n<information>d</information>\n<think>b</think><answer>c</answer>",
            "policy",
            True,
        ),
        ("<think>a</think><search>q</search><think>b</think><answer>c</answer>", "policy", False),  # no info
        ("<answer>b</answer>", "policy", False),  # must think first
        ("<think>a</think> stray <answer>b</answer>", "policy", False),
        ("<think>a<search>q</search></think><answer>b</answer>", "policy", False),  # nested
        ("<think>a</think><answer>b</answer><think>c</think>", "policy", False),  # after answer
        ("<think>a</think><task>q</task><result>r</result><think>b</think><answer>c</answer>", "planner", True),
        (
            "<think>a</think><search>q</search><information>d</information><think>b</think><answer>c</answer>",
            "planner",
            False,
        ),
        (
            "<think>a</think><search>q</search><documents>d</documents><refine>r</refine><answer>c</answer>",
            "executor",
            True,
        ),
        ("<think>a</think><search>q</search><documents>d</documents><answer>c</answer>", "executor", False),
        ("", "policy", False),
    ],
)
def test_strict_sequence_validator(text, role, valid):
    assert is_valid_sequence(text, role) is valid


def test_validator_gives_reason():
    ok, reason = validate_sequence("<think>a</think> x", "policy")
    assert not ok and "outside a tag" in reason


def test_refine_score_cover_em():
    assert refine_score("<refine>He was born in Paris.</refine><refine>x</refine>", ["paris"]) == 1.0
    assert refine_score("<refine>Parisian</refine>", ["paris"]) == 0.0  # word boundary
    assert refine_score("no refine", ["paris"]) == 0.0


def test_information_reverse_rank():
    blocks = ["nothing", "Paris is big", "paris"]  # the retrieved documents, in order
    assert information_reverse_rank(blocks, ["Paris"]) == pytest.approx(1 / 2 + 1 / 3)
    assert information_reverse_rank(blocks, ["yes"]) == 0.5
    assert information_reverse_rank([], ["Paris"]) == 0.0


def test_mrr():
    assert reciprocal_rank(["a", "b_chunk_2", "c"], {"b"}) == pytest.approx(0.5)
    assert reciprocal_rank(["b_chunk_2"], {"b"}, strip_chunks=False) == 0.0
    assert mrr([["x", "y", "g"], ["g"]], ["g"]) == 1.0
    assert mrr([["x", "y", "g"]], ["g"]) == pytest.approx(1 / 3)
    assert mrr([], ["g"]) == 0.0
    assert document_id("0000012_chunk_3") == "0000012" and document_id("7") == "7"
