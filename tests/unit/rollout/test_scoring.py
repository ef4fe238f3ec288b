"""Scoring glue: recipe rewards reach every sample (CoDA executors share their planner's), group-level
combination for the tool agent, answer metrics for eval — numbers by hand."""

from __future__ import annotations

import math

import pytest

from agents import get_agent
from agents.core.episode import Episode, RewardResult, TokenTrajectory
from agents.core.llm import Generation
from agents.datasets import PromptRecord
from agents.prompts import FINAL_ANSWER_NUDGE, INVALID_PLANNER_ACTION, INVALID_SEARCH_ACTION
from services.rollout.config import RolloutSettings
from services.rollout.embedding import hashing_embed
from services.rollout.scoring import Scorer, answer_metrics, build_group, combine_group, score_episode
from tests.unit.agents.helpers import make_ctx, scripted

RECORD = PromptRecord(prompt_id="p", question="q", golden_answers=["Paris"], data_source="nq")


def traj(role: str, text: str, parent: str | None = None) -> TokenTrajectory:
    t = TokenTrajectory([1, 2, 3], role=role, parent_id=parent)
    t.add_generation(Generation([5, 6], [-0.1, -0.2], text, "stop", None, 0))
    return t


def test_coda_reward_goes_to_planner_and_executors():
    planner = traj("planner", "<think>x</think><task>t</task><answer>Paris</answer>")
    executor = traj(
        "executor",
        "<think>a</think><search>s</search><refine>Paris</refine><answer>Paris</answer>",
        parent=planner.sample_id,
    )
    episode = Episode(main=planner, children=[executor], answer="Paris")
    settings = RolloutSettings.load(
        agent="coda", coda={"reward_mode": "shared"}
    )  # per_role: tests/unit/rl/test_peco_reward.py
    reward = score_episode(settings, RECORD, episode, hashing_embed)
    # 6·1 − 3 + 0.1·(planner 3/3 + executor 4/4) + 0.1·refine 1 = 3.3
    assert reward.reward == pytest.approx(3.3)
    group = build_group(Scorer.of(settings), RECORD, [episode], [reward], version=0, timing={})
    assert [s.reward for s in group.samples] == [pytest.approx(3.3)] * 2
    assert group.samples[1].parent_id == group.samples[0].sample_id
    assert group.samples[0].reward_components["answer_em"] == 1.0


def test_tool_agent_group_combination_l2_and_explicit():
    rewards = [
        RewardResult(1.0, {"mrr": 1.0, "answer_similarity": 0.0, "format": 1.0}),
        RewardResult(0.5, {"mrr": 0.0, "answer_similarity": 0.5, "format": 0.0}),
    ]
    l2 = combine_group(RolloutSettings.load(agent="tool-agent", tool_agent={"reward_combination": "l2"}), rewards)
    assert [r.reward for r in l2] == [pytest.approx(math.sqrt(2)), pytest.approx(0.5)]
    assert l2[0].components["weight_mrr"] == 1.0
    assert combine_group(RolloutSettings.load(agent="tool-agent"), rewards) is rewards


def test_answer_metrics_for_eval():
    assert answer_metrics("search-r1", RECORD, "paris")["em"] == 1.0
    assert answer_metrics("search-r1", RECORD, None)["f1"] == 0.0
    math_record = PromptRecord(prompt_id="m", question="2+2?", golden_answers=["4"])
    assert answer_metrics("recursive-reasoner", math_record, "4.0")["numeric"] == 1.0


# ---------------------------------------------------------------- rewards read only what the policy sampled
# Environment text (invalid-action messages, the final-answer nudge, observations) mentions the tags; it
# must never count as the policy's answer, tags or retrievals.

TOM = PromptRecord(prompt_id="t", question="Who are the cat and the mouse?", golden_answers=["Tom and Jerry"])


async def test_search_r1_episode_without_an_answer_scores_zero():
    # Three invalid turns, then a forced final turn that ends with EOS: every <answer> in the text is the
    # environment's ("... between <answer> and </answer> ...").
    ctx, _ = make_ctx(scripted("I ramble </search>", "still </search>", "more </search>", "no idea"))
    episode = await get_agent("search-r1").run(ctx, TOM)
    text = episode.main.response_text
    assert INVALID_SEARCH_ACTION in text and FINAL_ANSWER_NUDGE in text and "<answer> and </answer>" in text
    assert episode.answer is None
    for metric in ("em", "f1"):
        settings = RolloutSettings.load(agent="search-r1", answer_metric=metric)
        reward = score_episode(settings, TOM, episode, hashing_embed)
        assert reward.reward == 0.0
        assert reward.components["has_answer"] == 0.0 and reward.components["f1"] == 0.0
        assert reward.components["valid_format"] == 0.0
    # training and eval score the same answer
    assert {k: reward.components[k] for k in ("em", "f1")} == {
        k: v for k, v in answer_metrics("search-r1", TOM, episode.answer).items() if k in ("em", "f1")
    }


async def test_coda_planner_format_counts_only_its_own_tags():
    # The planner writes <think> but never a task or an answer; the environment's invalid-action message
    # and nudge mention <task> and <answer> — they must not earn format credit or an "and" answer.
    ctx, _ = make_ctx(
        scripted("<think>hmm</think> </task>", "<think>hm</think> </task>", "<think>h</think> </task>", "I give up")
    )
    episode = await get_agent("coda").run(ctx, TOM)
    assert INVALID_PLANNER_ACTION in episode.main.response_text and episode.answer is None
    reward = score_episode(RolloutSettings.load(agent="coda"), TOM, episode, hashing_embed)
    assert reward.components["f1"] == 0.0 and reward.components["has_answer"] == 0.0
    assert reward.components["planner_format"] == pytest.approx(1 / 3)  # <think> only
    assert reward.reward == pytest.approx(-3 + 0.1 * (1 / 3))


async def test_retrieval_hit_comes_from_the_retriever_not_the_policy():
    # The policy writes its own <information> block holding the gold; the retriever never returned it.
    ctx, _ = make_ctx(
        scripted(
            "<think>t</think><information>Tom and Jerry</information><search> cartoon </search>",
            "<think>u</think><answer> Tom </answer>",
        )
    )
    episode = await get_agent("search-r1").run(ctx, TOM)
    settings = RolloutSettings.load(agent="search-r1", answer_metric="f1")
    reward = score_episode(settings, TOM, episode, hashing_embed)
    assert reward.components["retrieval_hit"] == 0.0
    assert reward.components["f1"] == pytest.approx(0.5) and reward.components["has_answer"] == 1.0


async def test_format_validity_is_decided_by_the_policy_turns():
    # Three searches use up the budget; the environment's nudge sits between the last <information> and the
    # forced answer. The policy's own sequence is think → (search → information → think)* → answer: valid.
    ctx, _ = make_ctx(
        scripted(
            "<think>a</think><search> q </search>",
            "<think>b</think><search> r </search>",
            "<think>c</think><search> s </search>",
            "<think>d</think><answer> Tom and Jerry </answer>",
        )
    )
    episode = await get_agent("search-r1").run(ctx, TOM)
    assert FINAL_ANSWER_NUDGE in episode.main.response_text and episode.main.finish_reason == "budget"
    reward = score_episode(RolloutSettings.load(agent="search-r1"), TOM, episode, hashing_embed)
    assert reward.components["valid_format"] == 1.0 and reward.reward == 1.0
    assert len(episode.main.observations("information")) == 3
