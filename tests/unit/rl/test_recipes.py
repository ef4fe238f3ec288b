"""Agent rewards, each checked against a hand-computed total."""

import numpy as np
import pytest

from agents.rewards.efficiency import think_format_fraction, token_efficiency
from agents.rewards.formulas import (
    ExecutorRun,
    coda_reward,
    recursive_reasoner_reward,
    tool_agent_reward,
)
from agents.rewards.planner_json import parse_planner_json, plan_subproblems
from agents.rewards.similarity import answer_similarity, cosine, subproblem_independence
from agents.search_r1 import search_r1_reward

# What each role wrote itself (observations are not part of it) and what the environment gave it.
PLANNER = "<think>p</think><task>who?</task><think>q</think><answer>Barack Obama Jr.</answer>"
EXEC_FULL = ExecutorRun(
    "<think>a</think><search>q</search><refine>Barack Obama won</refine><answer>x</answer>", documents=["d"]
)
EXEC_HALF = ExecutorRun("<think>a</think><answer>x</answer>")


def test_coda_reward_hand_computed():
    r = coda_reward("Barack Obama Jr.", PLANNER, [EXEC_FULL, EXEC_HALF], ["Barack Obama"])
    # F1 0.8 -> 6·0.8−3 = 1.8; fmt planner 1, executors mean (1 + 0.5)/2 = 0.75; refine 1 (cover-EM)
    assert r.reward == pytest.approx(1.8 + 0.1 * (1 + 0.75) + 0.1 * 1)
    assert r.components["f1"] == pytest.approx(0.8) and r.components["has_answer"] == 1.0
    assert r.components["executor_format"] == pytest.approx(0.75)
    assert r.components["refine"] == 1.0 and r.components["num_executors"] == 2.0


def test_coda_reward_bounds_and_override():
    assert coda_reward(None, "garbage", [], ["x"]).reward == -3.0
    best = coda_reward("x", PLANNER, [ExecutorRun(EXEC_FULL.generated.replace("Barack Obama", "x"))], ["x"])
    assert best.reward == pytest.approx(3.3)
    judged = coda_reward("Barack Obama Jr.", PLANNER, [], ["nothing"], answer_score=0.5, format_weight=0.0)
    assert judged.reward == 0.0


def test_coda_information_reverse_rank_reads_the_retrieved_documents():
    found = ExecutorRun(
        "<think>a</think><search>q</search><refine>r</refine><answer>x</answer>",
        documents=["nothing", "Barack Obama was born in Hawaii"],
    )
    faked = ExecutorRun("<documents>Barack Obama</documents><answer>x</answer>")  # written by the policy
    r = coda_reward("x", PLANNER, [found, faked], ["Barack Obama"])
    assert r.components["information_reverse_rank"] == pytest.approx(1 / 2)
    assert coda_reward("x", PLANNER, [faked], ["Barack Obama"]).components["information_reverse_rank"] == 0.0


def test_search_r1_plain_em():
    assert search_r1_reward("Paris", ["paris"]).reward == 1.0
    assert search_r1_reward("Lyon", ["paris"]).reward == 0.0
    assert search_r1_reward(None, ["paris"]).reward == 0.0


@pytest.mark.parametrize(
    ("answer", "action_text", "information", "expected"),
    [
        ("Paris", "<think>t</think><answer>Paris</answer>", [], 1.0),  # correct & valid
        ("Paris", "<answer>Paris</answer>", [], 0.8),  # correct & invalid: 1 − 0.2
        (
            "Lyon",
            "<think>t</think><search>q</search><information></information><think>u</think><answer>Lyon</answer>",
            ["Paris is in France"],
            0.2 + 0.05,
        ),  # wrong & valid with a retrieval hit
        ("Lyon", "<think>t</think><answer>Lyon</answer>", [], 0.2),  # wrong & valid
        ("Lyon", "<answer>Lyon</answer>", [], 0.1),  # wrong & invalid
        (None, "rambling", [], 0.0),  # no answer & invalid
    ],
)
def test_search_r1_format_shaping(answer, action_text, information, expected):
    r = search_r1_reward(
        answer,
        ["Paris"],
        action_text=action_text,
        information=information,
        structure_format_score=0.2,
        final_format_score=0.1,
        retrieval_score=0.05,
    )
    assert r.reward == pytest.approx(expected)


def test_recursive_reasoner_reward():
    r = recursive_reasoner_reward(parsed=True, correct=True, tokens=250, decomposed=True, independence=0.6)
    assert r.reward == pytest.approx(1.0 + 0.2 * 0.75 + 0.3 * 0.6)
    atomic = recursive_reasoner_reward(parsed=True, correct=False, tokens=5000, decomposed=False, independence=0.9)
    assert atomic.reward == pytest.approx(0.3 * 0.5)
    assert (
        recursive_reasoner_reward(parsed=False, correct=True, tokens=0, decomposed=True, independence=1).reward == 0.1
    )


def test_tool_agent_reward():
    r = tool_agent_reward(
        retrieved_ids=[["a", "g_chunk_1"]],
        gold_doc_ids=["g"],
        similarity=0.7,
        think_fraction=0.5,
        weights={"mrr": 0.0, "answer_similarity": 1.0, "format": 1.0},
    )
    assert r.reward == pytest.approx(1.2)
    assert r.components["mrr"] == 0.5
    with pytest.raises(ValueError, match="unknown"):
        tool_agent_reward(retrieved_ids=[], gold_doc_ids=[], similarity=0, think_fraction=0, weights={"x": 1})


def test_efficiency_and_think_fraction():
    assert token_efficiency(250, 1000) == 0.75
    assert token_efficiency(2000, 1000) == 0.0
    with pytest.raises(ValueError):
        token_efficiency(1, 0)
    msgs = [
        {"role": "assistant", "content": "<think>a</think>call"},
        {"role": "tool", "content": "{}"},
        {"role": "assistant", "content": "final"},
    ]
    assert think_format_fraction(msgs) == 0.5
    assert think_format_fraction([m for m in msgs if m["role"] != "tool"]) == 0.0


def _embed_table(table):
    return lambda texts: np.array([table[t] for t in texts], dtype=float)


def test_similarity_and_independence():
    embed = _embed_table({"a": [1, 0], "b": [1, 1], "c": [-1, 0], "d": [0, 1]})
    assert cosine(np.array([1, 0]), np.array([1, 1])) == pytest.approx(2**-0.5)
    assert answer_similarity("a", "b", embed) == pytest.approx(2**-0.5)
    assert answer_similarity("a", "c", embed) == 0.0  # clipped at 0
    assert answer_similarity(None, "a", embed) == 0.0
    # pairs (a,b)=0.7071, (a,d)=0, (b,d)=0.7071 -> mean 0.4714 -> 1 − 0.4714
    assert subproblem_independence(["a", "b", "d"], embed) == pytest.approx(1 - 2 * 2**-0.5 / 3)
    assert subproblem_independence(["a"], embed) == 0.5


def test_parse_planner_json():
    text = (
        'Sure!\n```json\n{"plan": "x"}\n{"should_decompose": true, "subproblems": ["a {b}", "c"],\n'
        ' "plan": "two\nlines"}\n```'
    )
    plan = parse_planner_json(text)
    assert plan["should_decompose"] is True and plan["plan"] == "two\nlines"
    assert plan_subproblems(plan) == ["a {b}", "c"]
    assert parse_planner_json('{"plan": "only"}') == {"plan": "only"}
    assert parse_planner_json("no json {broken") is None
    assert plan_subproblems({"should_decompose": False, "subproblems": ["x"]}) == []
    assert parse_planner_json(r'{"should_decompose": false, "plan": "say \"hi\" }"}')["plan"] == 'say "hi" }'
