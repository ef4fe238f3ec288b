"""One test per defect of the upstream projects (``docs/upstream.md``) that the RL math covers, named after
what we do instead.

Other defect tests live beside the function they exercise:
  dynamic micro-batches rescaled the gradient (CoDA)
      → test_objective::test_dynamic_micro_batch_sizes_do_not_rescale_gradient
  RED accuracy counted executor rows → test_red::test_red_accuracy_excludes_executor_rows
  RED final weight floored at 1 → test_red::test_red_final_floor_configurable_default_below_one
  RED EMAs initialised to 1.0 → test_red::test_red_emas_seeded_from_first_measurement
  std weighting 0/0, PCA sign arbitrary (tool agent)
      → test_combine::test_std_weighting_all_zero_std_no_nan, test_combine::test_pca_sign_anchored
  planner scored on the executor tag list (CoDA)
      → test_rewards_text::test_planner_scored_on_planner_tags_even_if_text_mentions_refine
"""

import math

import pytest
import torch

from agents.answers import extract_answer
from agents.rewards.formulas import ExecutorRun, coda_reward, recursive_reasoner_reward
from services.trainer.logprobs import _head_chunk
from services.trainer.rl.advantages import group_advantages
from services.trainer.rl.loss import ClipConfig, LossConfig, LossInputs, ppo_token_loss, rl_loss


def test_coda_answer_term_is_six_f1_minus_three_and_format_is_planner_plus_executor():
    # CoDA's README said "F1" and "format +0.1"; its code (which we match) is 6·F1−3 and
    # 0.1·(planner_fmt + executor_fmt), i.e. up to +0.2.
    planner = "<think>a</think><answer>x y</answer>"  # F1 vs "x" = 2·0.5·1/1.5 = 2/3; planner fmt 2/3
    executor = "<think>a</think><search>q</search><refine>r</refine><answer>z</answer>"
    r = coda_reward("x y", planner, [ExecutorRun(executor, ["d"])], ["x"])
    assert r.components["answer_term"] == pytest.approx(6 * (2 / 3) - 3)
    assert r.reward == pytest.approx(1.0 + 0.1 * (2 / 3 + 1.0))


def test_grpo_one_shared_index_is_not_one_group():
    # Upstream a missing or per-source index put unrelated prompts in one GRPO group. Groups are keyed
    # by the globally unique group id, so two prompts with index 0 keep separate baselines.
    res = group_advantages([1.0, 0.0, 5.0, 5.0], ["uuid-a", "uuid-a", "uuid-b", "uuid-b"], estimator="dr_grpo")
    assert res.advantages.tolist() == [0.5, -0.5, 0.0, 0.0]
    merged = group_advantages([1.0, 0.0, 5.0, 5.0], ["0"] * 4, estimator="dr_grpo")
    assert merged.advantages.tolist() != res.advantages.tolist()  # what upstream's key would have done


def test_answer_needs_only_one_answer_tag_in_the_response():
    # Search-R1 scored prompt+response and demanded ≥ 2 <answer> matches; we score the response.
    assert extract_answer("<think>t</think><answer>Paris</answer>") == "Paris"


def test_ppo_clip_is_applied():
    # The upstream tool-calling agent had no clipping at all (single-step REINFORCE).
    loss, info = ppo_token_loss(
        torch.tensor([[math.log(2.0)]]), torch.tensor([[0.0]]), torch.tensor([1.0]), ClipConfig(0.2, 0.2)
    )
    assert loss.item() == pytest.approx(-1.2) and info["clipped"].all()


def test_token_efficiency_budget_and_count_are_parameters():
    # The upstream recursive reasoner charged only worker tokens against a hard-coded 1000.
    r = recursive_reasoner_reward(
        parsed=True, correct=False, tokens=300, decomposed=False, independence=0.0, token_budget=600
    )
    assert r.components["token_efficiency"] == pytest.approx(0.5)


def test_kl_coefficient_defaults_to_zero_and_needs_no_reference():
    # The recursive reasoner's KL depended on the installed TRL version's default β; ours is explicit, 0 by default.
    assert LossConfig().kl_coef == 0.0
    logp = torch.tensor([[-1.0]])
    loss, metrics = rl_loss(
        LossInputs(logp, logp.clone(), torch.tensor([2.0]), torch.tensor([[1.0]])), LossConfig(), normaliser=1.0
    )
    assert loss.item() == pytest.approx(-2.0) and "kl" not in metrics


def test_rl_and_sft_entropy_use_the_categorical_estimator_not_sampled_nll():
    # RED-CoDA compared the SFT side's categorical entropy with the RL side's −log π(sampled token). Both sides
    # take their entropy from the forward pass (``_head_chunk``), which gives the categorical one.
    head = torch.nn.Linear(3, 3, bias=False)
    torch.nn.init.eye_(head.weight)  # logits = hidden state
    logits = torch.tensor([[3.0, 0.0, 0.0]])
    logp, entropy = _head_chunk(head, logits, torch.tensor([1]), 1.0)  # one sampled low-probability token
    # H = ln(e³ + 2) − 3·e³/(e³ + 2) = 0.36659; the sampled token's NLL is ln(e³ + 2) = 3.09492
    assert entropy.item() == pytest.approx(0.3665940, rel=1e-6)
    assert -logp.item() == pytest.approx(3.0949230, rel=1e-6)
