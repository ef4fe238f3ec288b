"""A CoDA episode runs as many executors as its tasks need and no more: a <task> block holds one sub-question per
line, run in parallel; a task asked again, or one that restates the question once an executor has answered,
gets the episode's earlier answer without a new executor, and still costs the planner (scripted policy, stopping
at </task> as vLLM does)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agents import get_agent
from agents.base import Scoring
from agents.coda import CodaFacts, CoDAParams, known_answer, per_role_reward, split_tasks
from agents.coda import reward as coda_reward
from agents.core.turns import Budget, validate_sequence
from agents.datasets import PromptRecord
from agents.prompts import PLANNER_SYSTEM, CharTokenizer
from tests.unit.agents.helpers import VLLMLikeGenerator, make_ctx

QUESTION = "Where was the author of Hamlet born?"
RECORD = PromptRecord(prompt_id="q", question=QUESTION, golden_answers=["Stratford-upon-Avon"])
EXECUTOR_ANSWERS = {
    "Who wrote Hamlet?": "William Shakespeare",
    "Where was William Shakespeare born?": "Stratford-upon-Avon",
}


def _run(planner_turns: list[str]):
    tok = CharTokenizer()

    def script(prompt: str) -> str:
        if PLANNER_SYSTEM[:40] in prompt:
            # The turns written so far: the </task>s past the instructions' own.
            return planner_turns[prompt.count("</task>") - PLANNER_SYSTEM.count("</task>")]
        task = prompt.rsplit("Question: ", 1)[1].split("\n")[0].strip()
        return f"<think>know it</think><answer> {EXECUTOR_ANSWERS.get(task, 'nobody')} </answer>"

    ctx, _ = make_ctx(lambda prompt, model: "")
    ctx.tok, ctx.policy = tok, VLLMLikeGenerator(tok, script)
    ctx.budgets["planner"] = Budget(max_turns=4, max_tokens=400, max_obs_tokens=300, max_context_tokens=20000)
    return ctx


def test_a_task_block_holds_one_sub_question_per_line():
    assert split_tasks(" Who wrote Hamlet?\n\n  Where was he born? ") == ["Who wrote Hamlet?", "Where was he born?"]
    assert split_tasks("Who wrote Hamlet?") == ["Who wrote Hamlet?"]
    assert split_tasks("  ") == [""]  # an empty block is still one (empty) task, as it was


def test_what_the_episode_already_knows():
    asked = {"who wrote hamlet": "William Shakespeare"}
    assert known_answer("Who wrote HAMLET?", QUESTION, asked, "x") == "William Shakespeare"  # same normalised text
    assert known_answer("Where was the author of Hamlet born", QUESTION, asked, "Stratford") == "Stratford"
    assert known_answer("Where was the author of Hamlet born", QUESTION, {}, "") is None  # nothing known yet
    assert known_answer("Where was William Shakespeare born?", QUESTION, asked, "x") is None  # a new hop


async def test_repeated_and_restating_tasks_run_no_new_executor():
    ctx = _run(
        [
            "<think>hop 1</think><task> Who wrote Hamlet? </task>",
            # hop 1 again (case and mark aside), hop 2, and hop 2 twice in the same block
            "<think>hop 2</think><task> who wrote Hamlet\nWhere was William Shakespeare born?\n"
            "Where was William Shakespeare born? </task>",
            f"<think>again</think><task> {QUESTION} </task>",  # the whole question, once an answer is known
            "<think>done</think><answer> Stratford-upon-Avon </answer>",
        ]
    )
    episode = await get_agent("coda").run(ctx, RECORD)
    assert episode.answer == "Stratford-upon-Avon"
    facts = episode.facts
    assert facts.tasks == (
        "Who wrote Hamlet?",
        "who wrote Hamlet",
        "Where was William Shakespeare born?",
        "Where was William Shakespeare born?",
        QUESTION,
    )
    shakespeare, stratford = "William Shakespeare", "Stratford-upon-Avon"
    assert facts.executor_answers == (shakespeare, shakespeare, stratford, stratford, stratford)
    assert facts.executed == (True, False, True, False, False)
    # Two executors for five tasks: one per new sub-question, each given its own task.
    assert [ctx.tok.decode(c.ids).rsplit("Question: ", 1)[1].split("\n")[0] for c in episode.children] == [
        "Who wrote Hamlet?",
        "Where was William Shakespeare born?",
    ]
    assert facts.executed_tasks() == [
        ("Who wrote Hamlet?", shakespeare),
        ("Where was William Shakespeare born?", stratford),
    ]
    # The three-line block gets three <result> blocks, in line order; the restated question the latest answer.
    text = episode.main.response_text
    second = text.split("</task>")[2].split("<think>")[0]
    assert (
        second == f"\n<result>{shakespeare}</result>\n\n<result>{stratford}</result>\n\n<result>{stratford}</result>\n"
    )
    assert text.split("</task>")[3].split("<think>")[0] == f"\n<result>{stratford}</result>\n"
    assert validate_sequence(text, "planner") == (True, "")  # task → result+ → think

    scored = coda_reward(episode, Scoring(record=RECORD, settings=SimpleNamespace(), metric="f1"))
    c = scored.components
    # Penalised all the same: tasks 2 and 4 repeat an earlier one (2/5), task 5 restates the question (1/5).
    assert c["repeated"] == pytest.approx(0.4) and c["restated"] == pytest.approx(0.2)
    assert c["num_executors"] == 2.0 and set(scored.per_trajectory) == {ch.sample_id for ch in episode.children}
    # F1 1 → 3; no plan → no facts; −(0.2 + 0.4); every planner tag filled → +0.1
    assert scored.reward == pytest.approx(3 - 0.6 + 0.1)


async def test_the_question_delegated_whole_runs_its_executor_when_nothing_is_known_yet():
    # HotpotQA's planner delegates its question whole (no plan splits it): that first task must still search.
    EXECUTOR_ANSWERS[QUESTION] = "Stratford-upon-Avon"
    try:
        ctx = _run(
            [
                f"<think>ask</think><task> {QUESTION} </task>",
                "<think>done</think><answer> Stratford-upon-Avon </answer>",
            ]
        )
        episode = await get_agent("coda").run(ctx, RECORD)
    finally:
        del EXECUTOR_ANSWERS[QUESTION]
    assert episode.facts == CodaFacts((QUESTION,), ("Stratford-upon-Avon",), (True,)) and len(episode.children) == 1


def test_facts_whose_executed_flags_miss_the_executors_are_an_error():
    from agents.core.episode import Episode, TokenTrajectory

    episode = Episode(main=TokenTrajectory([1], role="planner"), children=[TokenTrajectory([1], role="executor")])
    episode.facts = CodaFacts(("a?", "a?"), ("x", "x"), (True, True))  # two ran, one child
    with pytest.raises(ValueError, match="2 tasks and 2 answers for 1 executors"):
        per_role_reward(episode, Scoring(record=RECORD, settings=None, metric="f1"), CoDAParams())
