"""CoDA's per-role reward (agents/rewards/peco.py): each role against hand-computed numbers on a 2-hop question,
the shared ablation arm equal to today's coda_reward, and each trajectory's own reward reaching its sample."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from agents.answers import token_f1
from agents.base import Scoring
from agents.coda import CodaFacts
from agents.coda import reward as coda_episode_reward
from agents.core.episode import Episode, RewardResult, TokenTrajectory
from agents.core.llm import Generation
from agents.core.turns import nonempty_role_format_score, nonempty_tag_format_score, role_format_score
from agents.datasets import HELDOUT, PromptRecord
from agents.plans import SubQuestion, plan_for_record
from agents.rewards.formulas import ExecutorRun, coda_reward
from agents.rewards.peco import (
    FACT_FOUND,
    RESTATES,
    TASK_MATCH,
    ExecutorTurns,
    executor_reward,
    facts_obtained,
    match_subquestion,
    peco_reward,
    planner_reward,
    repeated_fraction,
    restated_fraction,
    restates,
)
from services.rollout.config import RolloutSettings
from services.rollout.embedding import hashing_embed
from services.rollout.scoring import Scorer, build_group, score_episode

ROOT = Path(__file__).resolve().parents[3]
QUESTION = "Where was the director of film Red Kite born?"
GOLDS = ["Lisbon", "Lisboa"]
# 2Wiki's layout: the evidence triples say what each hop asks.
RECORD = PromptRecord(
    prompt_id="d",
    question=QUESTION,
    golden_answers=GOLDS,
    data_source="2wikimultihopqa",
    split="train",
    metadata={
        "type": "compositional",
        "supporting_titles": ["Red Kite", "Tomas Vale"],
        "evidences": [["Red Kite", "director", "Tomas Vale"], ["Tomas Vale", "place of birth", "Lisbon"]],
    },
)
# The plan of RECORD, written out so that the numbers below do not depend on how agents.plans reads rows.
SUBQ = (
    SubQuestion("Who directed Red Kite?", ("Tomas Vale",)),
    SubQuestion("Where was Tomas Vale born?", ("Lisbon", "Lisbon", "Lisboa")),
)

# Hop 1 found the bridge entity: a paraphrased task, everything filled in.
HOP1 = ExecutorTurns(
    "e1",
    "Who is the director of Red Kite?",
    "Tomas Vale",
    "<think>find the film</think><search>Red Kite director</search>"
    "<refine>Red Kite was directed by Tomas Vale.</refine><answer>Tomas Vale</answer>",
)
# Hop 2 failed, with an empty <think> and a blank <refine>.
HOP2 = ExecutorTurns(
    "e2",
    "Where was Tomas Vale born?",
    "Porto",
    "<think></think><search>Tomas Vale birthplace</search><refine> </refine><answer>Porto</answer>",
)
# The question delegated whole, answered partly.
WHOLE = ExecutorTurns(
    "e3",
    QUESTION,
    "Lisbon, Portugal",
    "<think>t</think><search>q</search><refine>He was born in Lisbon.</refine><answer>Lisbon, Portugal</answer>",
)
PLANNER = (
    "<think>two hops</think><task>Who is the director of Red Kite?</task>"
    "<think>now hop 2</think><task>Where was Tomas Vale born?</task><answer>Porto</answer>"
)


# ---------------------------------------------------------------- the plan
def test_the_record_has_its_plan_and_a_held_out_one_has_none():
    plan = plan_for_record(RECORD)
    assert plan is not None and len(plan.tasks) == 2  # its wording is agents.plans' business
    assert plan.tasks[0].answers[0] == "Tomas Vale" and plan.tasks[1].answers[0] == "Lisbon"
    # The hand-written tasks below are about the same hops as the plan's own.
    assert [match_subquestion(sq.task, plan.tasks, QUESTION) for sq in SUBQ] == [0, 1]
    held_out = PromptRecord(**{**RECORD.__dict__, "split": HELDOUT})
    assert plan_for_record(held_out) is None


# ---------------------------------------------------------------- thresholds (the numbers their comments cite)
def test_the_thresholds_sit_where_their_comments_say():
    # A paraphrase keeping entity and relation matches.
    assert token_f1("Who is the director of Red Kite?", SUBQ[0].task) == pytest.approx(0.6)
    assert TASK_MATCH <= 0.6
    # Templated sub-questions share words: the closest one wins.
    comparison = (
        SubQuestion("When was Red Kite released?", ("1961",)),
        SubQuestion("When was Blue Heron released?", ("1950",)),
    )
    assert token_f1(comparison[0].task, comparison[1].task) == pytest.approx(0.6)
    assert match_subquestion("When was Blue Heron released?", comparison) == 1
    # The whole question can clear the bar against a hop, and still goes to the golds.
    wordy = (SubQuestion("Who is the director of film Red Kite?", ("Tomas Vale",)), SUBQ[1])
    assert token_f1(QUESTION, wordy[0].task) == pytest.approx(2 / 3)
    assert match_subquestion(QUESTION, wordy) == 0  # without the question to compete
    assert match_subquestion(QUESTION, wordy, QUESTION) is None
    assert match_subquestion("Tell me about films", SUBQ, QUESTION) is None
    # A right part of the name obtains the fact; a name with one token wrong does not (exactly 0.5).
    assert token_f1("Tomas", "Tomas Vale") == pytest.approx(2 / 3)
    assert token_f1("Tomas Reis", "Tomas Vale") == pytest.approx(FACT_FOUND)
    assert facts_obtained(SUBQ, ["Tomas Reis"]) == 0.0 and facts_obtained(SUBQ, ["Tomas"]) == 0.5
    assert RESTATES == 0.8


def test_the_report_counts_restated_tasks_with_the_same_threshold():
    from bench import _qa_report

    assert _qa_report.RESTATES is RESTATES


# ---------------------------------------------------------------- executor
def test_matched_executor_is_scored_against_its_own_sub_question():
    assert match_subquestion(HOP1.task, SUBQ, QUESTION) == 0 and match_subquestion(HOP2.task, SUBQ, QUESTION) == 1
    r = executor_reward(HOP1, SUBQ, QUESTION, GOLDS)
    # F1("Tomas Vale", "Tomas Vale") = 1 → 6·1 − 3 = 3; 4/4 tags with content; its refine covers "Tomas Vale"
    assert r.reward == pytest.approx(3 + 0.1 * 1 + 0.1 * 1)
    assert r.components == {
        "executor_score": 1.0,
        "executor_matched": 1.0,
        "executor_format": 1.0,
        "executor_refine": 1.0,
    }
    # Against the final golds (what the shared reward and its refine read) it would have scored nothing.
    assert token_f1(HOP1.answer, GOLDS) == 0.0


def test_failed_hop_and_empty_tags():
    r = executor_reward(HOP2, SUBQ, QUESTION, GOLDS)
    # "Porto" vs Lisbon/Lisboa: 0 → −3; tags with content: search, answer = 2/4; the blank refine covers nothing
    assert r.reward == pytest.approx(-3 + 0.1 * 0.5)
    assert r.components["executor_format"] == 0.5 and r.components["executor_refine"] == 0.0
    assert role_format_score(HOP2.generated, "executor") == 1.0  # the old scorer paid for the empty tags


def test_unmatched_executor_and_no_plan_are_scored_against_the_golds():
    assert match_subquestion(WHOLE.task, SUBQ, QUESTION) is None
    r = executor_reward(WHOLE, SUBQ, QUESTION, GOLDS)
    # F1("Lisbon, Portugal", "Lisbon") = 2·(1/2·1)/(3/2) = 2/3 → 6·2/3 − 3 = 1; format 1; refine covers "Lisbon"
    assert r.reward == pytest.approx(1 + 0.1 + 0.1)
    assert r.components["executor_matched"] == 0.0 and r.components["executor_score"] == pytest.approx(2 / 3)
    # No plan: even a hop-1 task is judged by the golds, which "Tomas Vale" misses.
    no_plan = executor_reward(HOP1, (), QUESTION, GOLDS)
    assert no_plan.reward == pytest.approx(-3 + 0.1 * 1 + 0.1 * 0)
    assert no_plan.components["executor_matched"] == 0.0


# ---------------------------------------------------------------- planner
def test_planner_gains_the_facts_its_executors_found():
    r = planner_reward("Porto", PLANNER, [HOP1.task, HOP2.task], [HOP1.answer, HOP2.answer], QUESTION, GOLDS, SUBQ)
    # final F1 0 → −3; "Tomas Vale" found, Lisbon not → facts 1/2; no task restates (0.57 and 0.46 < 0.8);
    # think, task, answer all with content → format 1
    assert r.reward == pytest.approx(-3 + 1.0 * 0.5 - 1.0 * 0 + 0.1 * 1)
    assert r.components["facts_obtained"] == 0.5 and r.components["restated"] == 0.0
    assert r.components["f1"] == 0.0 and r.components["has_answer"] == 1.0 and r.components["has_plan"] == 1.0


def test_a_restated_task_costs_the_planner():
    planner = f"<think>x</think><task>{QUESTION}</task><answer>Lisbon</answer>"
    r = planner_reward("Lisbon", planner, [QUESTION], [WHOLE.answer], QUESTION, GOLDS, SUBQ)
    # final F1 1 → 3; "Lisbon, Portugal" obtains hop 2's fact (2/3 > 0.5) → 1/2; its one task restates → 1/1
    assert r.reward == pytest.approx(3 + 0.5 - 1 + 0.1)
    assert r.components["restated"] == 1.0
    assert restated_fraction([QUESTION, HOP1.task], QUESTION) == 0.5
    weighted = planner_reward(
        "Lisbon", planner, [QUESTION], [WHOLE.answer], QUESTION, GOLDS, SUBQ, fact_weight=2.0, restate_penalty=0.5
    )
    assert weighted.reward == pytest.approx(3 + 2.0 * 0.5 - 0.5 * 1 + 0.1)


def test_a_kinship_hop_about_a_long_name_is_no_restatement():
    question = "Who is the paternal grandfather of Jan III of Oświęcim?"
    hop = "Who is the father of Jan III of Oświęcim?"
    # 7 tokens shared of the question's 9 and the hop's 8 (normalised: "the" dropped): F1 = 2·7/(9 + 8) = 0.82
    # ≥ 0.8, but "paternal" and "grandfather" are not asked: one hop, not the question.
    assert token_f1(hop, question) == pytest.approx(14 / 17)
    assert not restates(hop, question) and restates(question, question)
    assert restates("who is the Paternal Grandfather of Jan III of Oświęcim", question)  # case, punctuation
    assert restated_fraction([hop, "Who is the father of Jan II of Oświęcim?"], question) == 0.0


def test_planner_without_a_plan_has_no_fact_term():
    r = planner_reward("Lisbon", PLANNER, [HOP1.task], [HOP1.answer], QUESTION, GOLDS, ())
    assert r.reward == pytest.approx(3 + 0.1) and r.components["facts_obtained"] == 0.0
    assert r.components["has_plan"] == 0.0
    assert planner_reward(None, "", [], [], QUESTION, GOLDS, SUBQ).reward == -3.0


# ---------------------------------------------------------------- format credit only for content
def test_format_credit_only_for_tags_with_content():
    tags = ("think", "task", "answer")
    assert nonempty_tag_format_score("<think> </think><task>t</task><answer></answer>", tags) == pytest.approx(1 / 3)
    assert role_format_score("<think> </think><task>t</task><answer></answer>", "planner") == 1.0
    # every block must have content, not just one of them
    assert nonempty_tag_format_score("<think>a</think><think>\n</think>", ("think",)) == 0.0
    assert nonempty_tag_format_score("<think>a</think><think>b</think>", ("think",)) == 1.0
    # balanced counts in the wrong order or nested do not make blocks
    assert nonempty_tag_format_score("</answer>x<answer>", ("answer",)) == 0.0
    assert nonempty_tag_format_score("<think>a<think>b</think></think>", ("think",)) == 0.0
    assert nonempty_tag_format_score("<think>a</think>", ()) == 0.0
    assert nonempty_role_format_score(HOP1.generated, "executor") == 1.0


# ---------------------------------------------------------------- the episode
def test_peco_episode_is_the_planners_reward_and_executors_get_their_own():
    r = peco_reward("Porto", PLANNER, [HOP1, HOP2], QUESTION, GOLDS, SUBQ)
    assert r.reward == pytest.approx(-2.4)
    assert r.per_trajectory is not None and set(r.per_trajectory) == {"e1", "e2"}
    assert r.for_trajectory("e1").reward == pytest.approx(3.2)
    assert r.for_trajectory("e2").reward == pytest.approx(-2.95)
    assert r.for_trajectory("planner-id") is r  # anyone else takes the episode's
    c = r.components
    assert c["executor_score_mean"] == 0.5 and c["executor_matched_mean"] == 1.0
    assert c["executor_format_mean"] == pytest.approx(0.75) and c["executor_refine_mean"] == 0.5
    assert c["num_executors"] == 2.0 and c["answer_term"] == -3.0 and c["em"] == 0.0


def _traj(role: str, text: str, parent: str | None = None) -> TokenTrajectory:
    t = TokenTrajectory([1, 2, 3], role=role, parent_id=parent)
    t.add_generation(Generation([5, 6], [-0.1, -0.2], text, "stop", None, 0))
    return t


def _episode() -> Episode:
    planner = _traj("planner", PLANNER)
    children = [_traj("executor", e.generated, planner.sample_id) for e in (HOP1, HOP2)]
    facts = CodaFacts((HOP1.task, HOP2.task), (HOP1.answer, HOP2.answer))
    return Episode(main=planner, children=children, answer="Porto", facts=facts)


def test_build_group_gives_each_trajectory_its_own_reward():
    episode = _episode()
    settings = RolloutSettings.load(agent="coda")
    assert settings.coda.reward_mode == "per_role" and settings.coda.fact_weight == settings.coda.restate_penalty == 1.0
    reward = score_episode(settings, RECORD, episode, hashing_embed)
    group = build_group(Scorer.of(settings), RECORD, [episode], [reward], version=0, timing={})
    assert [s.role for s in group.samples] == ["planner", "executor", "executor"]
    assert [s.reward for s in group.samples] == [pytest.approx(v) for v in (-2.4, 3.2, -2.95)]
    planner, hop1, _ = (s.reward_components for s in group.samples)
    assert planner["f1"] == 0.0 and planner["facts_obtained"] == 0.5 and "executor_score" not in planner
    assert hop1["executor_score"] == 1.0 and "f1" not in hop1  # RED's accuracy key stays the planner's
    assert hop1["answer_f1"] == 0.0  # the episode's final-answer metrics are on every sample, as before


def test_shared_mode_is_todays_coda_reward_for_everyone():
    episode = _episode()
    settings = RolloutSettings.load(agent="coda", coda={"reward_mode": "shared"})
    reward = score_episode(settings, RECORD, episode, hashing_embed)
    today = coda_reward(
        "Porto", PLANNER, [ExecutorRun(c.generated_text, ()) for c in episode.children], GOLDS, metric="f1"
    )
    assert reward == today and reward.per_trajectory is None
    # final F1 0 → −3; old format: planner 1, executors (1 + 1)/2 (empty tags paid); refine vs the golds 0
    assert reward.reward == pytest.approx(-3 + 0.1 * (1 + 1) + 0.1 * 0)
    group = build_group(Scorer.of(settings), RECORD, [episode], [reward], version=0, timing={})
    assert [s.reward for s in group.samples] == [pytest.approx(-2.8)] * 3


def test_facts_out_of_step_with_the_executors_are_an_error():
    episode = _episode()
    episode.facts = CodaFacts((HOP1.task,), (HOP1.answer,))
    scoring = Scoring(record=RECORD, settings=SimpleNamespace(), metric="f1")
    with pytest.raises(ValueError, match="1 tasks and 1 answers for 2 executors"):
        coda_episode_reward(episode, scoring)


def test_reward_result_without_own_rewards_is_the_episodes_for_all():
    r = RewardResult(1.0, {"x": 1.0})
    assert r.for_trajectory("any") is r
    assert RewardResult(1.0, per_trajectory={}).for_trajectory("any").reward == 1.0


# ---------------------------------------------------------------- recipes: rollout and trainer agree
def _coda_recipes() -> list[Path]:
    return [
        p
        for p in sorted((ROOT / "configs").glob("*.toml"))
        if tomllib.loads(p.read_text()).get("rollout", {}).get("agent") in ("coda", "red-coda")
    ]


@pytest.mark.parametrize("path", _coda_recipes(), ids=lambda p: p.stem)
def test_per_role_reward_recipes_give_executors_their_own_baseline(path):
    # No contract between the services carries these two: with role_baseline "inherit" the trainer would copy the
    # planner's advantage onto the executors and their own rewards would go unused.
    table = tomllib.loads(path.read_text())
    if RolloutSettings.load(path).coda.reward_mode == "per_role":
        assert table["trainer"].get("role_baseline") == "per_role", path.name


def test_a_task_asked_again_costs_the_planner_like_a_restated_one():
    tasks = [HOP1.task, HOP2.task, HOP2.task, HOP2.task.upper()]  # hop 2 asked three times (case aside)
    assert repeated_fraction(tasks) == 0.5 and repeated_fraction([]) == 0.0
    planner = "<think>x</think>" + "".join(f"<task>{t}</task>" for t in tasks) + "<answer>Lisbon</answer>"
    answers = ["Tomas Vale", "Lisbon", "Lisbon", "Lisbon"]
    r = planner_reward("Lisbon", planner, tasks, answers, QUESTION, GOLDS, SUBQ)
    # final F1 1 → 3; both facts obtained → +1; none restates the question; 2 of 4 repeat → −0.5; format +0.1
    assert r.components["repeated"] == 0.5 and r.components["restated"] == 0.0
    assert r.reward == pytest.approx(3 + 1 - 0.5 + 0.1)
