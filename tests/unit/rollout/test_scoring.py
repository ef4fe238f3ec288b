"""Scoring glue: recipe rewards reach every sample (CoDA executors share their planner's), group-level
combination for the tool agent, answer metrics for eval — numbers by hand."""

from __future__ import annotations

import math

import pytest

from services.rollout.config import RolloutSettings
from services.rollout.embedding import hashing_embed
from services.rollout.scoring import answer_metrics, build_group, combine_group, score_episode
from shared.agents.context import Episode
from shared.agents.llm import Generation
from shared.agents.trajectory import TokenTrajectory
from shared.datasets import PromptRecord
from shared.rewards.result import RewardResult

RECORD = PromptRecord(prompt_id="p", question="q", golden_answers=["Paris"], data_source="nq")


def traj(role: str, text: str, parent: str | None = None) -> TokenTrajectory:
    t = TokenTrajectory([1, 2, 3], role=role, parent_id=parent)
    t.add_generation(Generation([5, 6], [-0.1, -0.2], text, "stop", None, 0))
    return t


def test_coda_reward_goes_to_planner_and_executors():
    planner = traj("planner", "<think>x</think><task>t</task><answer>Paris</answer>")
    executor = traj("executor", "<think>a</think><search>s</search><refine>Paris</refine><answer>Paris</answer>",
                    parent=planner.sample_id)
    episode = Episode(main=planner, children=[executor], answer="Paris")
    settings = RolloutSettings.load(agent="coda")
    reward = score_episode(settings, RECORD, episode, hashing_embed)
    # 6·1 − 3 + 0.1·(planner 3/3 + executor 4/4) + 0.1·refine 1 = 3.3
    assert reward.reward == pytest.approx(3.3)
    group = build_group(settings, RECORD, [episode], [reward], version=0, timing={})
    assert [s.reward for s in group.samples] == [pytest.approx(3.3)] * 2
    assert group.samples[1].parent_id == group.samples[0].sample_id
    assert group.samples[0].reward_components["answer_em"] == 1.0


def test_tool_agent_group_combination_l2_and_explicit():
    rewards = [RewardResult(1.0, {"mrr": 1.0, "answer_similarity": 0.0, "format": 1.0}),
               RewardResult(0.5, {"mrr": 0.0, "answer_similarity": 0.5, "format": 0.0})]
    l2 = combine_group(RolloutSettings.load(agent="tool-agent", reward_combination="l2"), rewards)
    assert [r.reward for r in l2] == [pytest.approx(math.sqrt(2)), pytest.approx(0.5)]
    assert l2[0].components["weight_mrr"] == 1.0
    assert combine_group(RolloutSettings.load(agent="tool-agent"), rewards) is rewards


def test_answer_metrics_for_eval():
    assert answer_metrics("search-r1", RECORD, "paris")["em"] == 1.0
    assert answer_metrics("search-r1", RECORD, None)["f1"] == 0.0
    math_record = PromptRecord(prompt_id="m", question="2+2?", golden_answers=["4"])
    assert answer_metrics("recursive-reasoner", math_record, "4.0")["numeric"] == 1.0
