"""One reward per agent, composed from the reward modules. Each returns a ``RewardResult``.

- ``coda_reward``: ``(6·F1 − 3) + w_fmt·(planner_fmt + mean executor_fmt) + w_ref·refine`` (R ∈ [−3, 3.3]).
- ``recursive_reasoner_reward``: ``w_c·correct + w_t·efficiency + w_i·independence``; 0.1 on a parse failure.
- ``tool_agent_reward``: MRR, answer similarity and the think-format fraction, weighted (the group-level
  combination schemes are in ``agents.rewards.combine``).

Every input is what the policy sampled or what the environment returned for its actions, each from its own
source: the answer the agent parsed (``Episode.answer``, the one eval scores), the policy's own turns
(``TokenTrajectory.generated_text`` / ``action_text``) and the observations' contents. None is re-parsed
from the whole response text, whose environment messages mention every tag (``<answer> and </answer>``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agents.answers import AnswerMetric, affine_answer_reward, answer_reward, as_gold_list
from agents.core.episode import RewardResult
from agents.core.turns import role_format_score
from agents.rewards.efficiency import token_efficiency
from agents.rewards.retrieval import information_reverse_rank, mrr, refine_score

__all__ = ["ExecutorRun", "coda_reward", "recursive_reasoner_reward", "tool_agent_reward"]


@dataclass(frozen=True)
class ExecutorRun:
    """What a CoDA reward reads of one executor: its own turns and the documents it was given."""

    generated: str  # the executor's turns (``TokenTrajectory.generated_text``)
    documents: Sequence[str] = ()  # contents of its ``<documents>`` observations, in order


def coda_reward(
    answer: str | None,
    planner_generated: str,
    executors: Sequence[ExecutorRun],
    golds: str | Iterable[str],
    *,
    metric: AnswerMetric = "f1",
    format_weight: float = 0.1,
    refine_weight: float = 0.1,
    answer_score: float | None = None,
) -> RewardResult:
    """CoDA: ``R = (6·s − 3) + format_weight·(fmt_planner + mean_e fmt_executor_e) + refine_weight·refine``.

    ``s`` is the ``metric`` score of the planner's ``answer`` (0 when ``None``), or ``answer_score`` when
    given (e.g. an LLM-judge score in [0, 1]). ``fmt`` is the graduated per-tag score of each role's own
    turns with its own tag list; the executor term is the mean over this planner's executors (0 with none).
    ``refine`` is 1 if any executor's ``<refine>`` text covers a gold (cover-EM). The same R goes to the
    planner and its executors. Components use the same names as ``answer_reward`` (``em``, ``f1``,
    ``sub_em``, ``cover_em``, ``has_answer``) so consumers (RED accuracy, eval tables) read one key whatever
    the agent.
    """
    golds = as_gold_list(golds)
    scores = answer_reward(answer, golds).components
    s = scores[metric] if answer_score is None else float(answer_score)
    planner_fmt = role_format_score(planner_generated, "planner")
    executor_fmt = (
        sum(role_format_score(e.generated, "executor") for e in executors) / len(executors) if executors else 0.0
    )
    refine = max((refine_score(e.generated, golds) for e in executors), default=0.0)
    answer_term = affine_answer_reward(s)
    reward = answer_term + format_weight * (planner_fmt + executor_fmt) + refine_weight * refine
    info_rr = max((information_reverse_rank(e.documents, golds) for e in executors), default=0.0)
    components = {
        "answer": s,
        "answer_term": answer_term,
        **scores,
        "planner_format": planner_fmt,
        "executor_format": executor_fmt,
        "refine": refine,
        "information_reverse_rank": info_rr,
        "num_executors": float(len(executors)),
    }
    return RewardResult(reward=reward, components=components)


def recursive_reasoner_reward(
    *,
    parsed: bool,
    correct: bool,
    tokens: int,
    decomposed: bool,
    independence: float,
    token_budget: int = 1000,
    correctness_weight: float = 1.0,
    token_weight: float = 0.2,
    independence_weight: float = 0.3,
    parse_failure_reward: float = 0.1,
) -> RewardResult:
    """``R = w_c·correct + w_t·(1 − min(tokens/T, 1)) + w_i·(independence if decomposed else 0.5)``.

    A plan that does not parse gets ``parse_failure_reward`` (0.1). ``tokens`` is what the caller charges the
    episode (the upstream recursive reasoner counted only the frozen worker's tokens and fixed T = 1000; here both are the caller's
    choice: count the tokens the trained planner controls, e.g. planner + worker).
    """
    if not parsed:
        return RewardResult(reward=parse_failure_reward, components={"parsed": 0.0})
    efficiency = token_efficiency(tokens, token_budget)
    indep = independence if decomposed else 0.5
    reward = correctness_weight * float(correct) + token_weight * efficiency + independence_weight * indep
    components = {
        "parsed": 1.0,
        "correct": float(correct),
        "token_efficiency": efficiency,
        "independence": indep,
        "decomposed": float(decomposed),
        "tokens": float(tokens),
    }
    return RewardResult(reward=reward, components=components)


TOOL_AGENT_WEIGHTS: Mapping[str, float] = {"mrr": 1.0, "answer_similarity": 1.0, "format": 1.0}


def tool_agent_reward(
    *,
    retrieved_ids: Sequence[Sequence[str]],
    gold_doc_ids: Iterable[str],
    similarity: float,
    think_fraction: float,
    weights: Mapping[str, float] | None = None,
) -> RewardResult:
    """Tool agent: ``R = Σ_k w_k · r_k`` over ``mrr`` (best reciprocal rank of a gold doc over the search
    calls), ``answer_similarity`` (``max(0, cos)``, see ``similarity.answer_similarity``) and ``format``
    (the ``</think>`` fraction, see ``efficiency.think_format_fraction``). Default weights are all 1.

    Group-level schemes (uniform, std, PCA, L2) re-combine the components with ``combine.combine_rewards``.
    """
    weights = dict(TOOL_AGENT_WEIGHTS if weights is None else weights)
    components = {
        "mrr": mrr(retrieved_ids, gold_doc_ids),
        "answer_similarity": float(similarity),
        "format": float(think_fraction),
    }
    unknown = set(weights) - set(components)
    if unknown:
        raise ValueError(f"unknown tool-agent reward weights {sorted(unknown)}; known: {sorted(components)}")
    reward = sum(weights.get(k, 0.0) * v for k, v in components.items())
    return RewardResult(reward=reward, components=components)
