"""The recursive math reasoner: a trained JSON planner decomposes a word problem; a frozen worker solves it.

The planner writes one JSON object (``should_decompose``, ``subproblems``, ``plan``) in a single turn; only
its tokens are trained. The frozen worker then solves each subproblem (concurrently: they are meant to be
independent) and combines the partial results, or solves the problem directly when the plan is atomic or
does not parse. Worker text never enters the planner's trajectory.

Reward: correctness of the worker's final number, token efficiency and the independence of the subproblems
(0.1 when the plan does not parse). Eval adds numeric accuracy. Knobs: ``RecursiveReasonerParams``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field

from agents.answers import numeric_match, parse_number
from agents.base import Agent, AgentParams, Scoring, episode_reward
from agents.core.episode import AgentContext, Episode, RewardResult, TokenTrajectory
from agents.core.llm import Generator
from agents.core.turns import AgentRole
from agents.datasets import PromptRecord
from agents.prompts import decomposer_prompt, worker_combine_prompt, worker_direct_prompt, worker_solve_prompt
from agents.rewards.formulas import recursive_reasoner_reward
from agents.rewards.planner_json import parse_planner_json, plan_subproblems
from agents.rewards.similarity import subproblem_independence


class RecursiveReasonerParams(AgentParams):
    """The recursive reasoner's own knobs, [rollout.recursive_reasoner] keys."""

    table: ClassVar[str] = "recursive_reasoner"

    worker_max_tokens: int = Field(256, ge=1, description="Tokens per frozen-worker call (recursive reasoner)")
    token_budget: int = Field(1000, ge=1, description="Recursive reasoner: tokens at which efficiency hits 0")


@dataclass(frozen=True)
class ReasonerFacts:
    parsed: bool  # the planner's JSON parsed
    decomposed: bool  # ... and named subproblems
    subproblems: tuple[str, ...]
    planner_tokens: int
    worker_tokens: int
    worker_final: str  # the worker's final text (the answer is parsed from it)


async def _work(llm: Generator, ctx: AgentContext, prompt: str) -> tuple[str, int]:
    budget = ctx.budget("worker")
    gen = await llm.generate(ctx.tok.encode(prompt), stop=[], max_tokens=budget.max_tokens)
    return gen.text, len(gen.token_ids)


def _json_number(text: str, key: str) -> str:
    parsed = parse_planner_json(text) or {}
    value = parsed.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    number = parse_number(str(value) if value is not None else text)
    return "" if number is None else str(number)


async def run_recursive_reasoner(ctx: AgentContext, record: PromptRecord) -> Episode:
    if ctx.frozen is None:
        raise RuntimeError("recursive-reasoner needs a frozen worker model")
    planner = TokenTrajectory(ctx.tok.encode(decomposer_prompt(record.question)), role="planner")
    budget = ctx.budget("planner")
    gen = await ctx.policy.generate(
        planner.next_prompt(),
        stop=[],
        max_tokens=min(budget.max_tokens, budget.max_context_tokens - planner.prompt_len),
    )
    planner.add_generation(gen)
    plan = parse_planner_json(gen.text)
    subproblems = plan_subproblems(plan) if plan else []
    if subproblems:
        solved = await asyncio.gather(
            *(_work(ctx.frozen, ctx, worker_solve_prompt(record.question, s)) for s in subproblems)
        )
        steps = [
            (s, _json_number(text, "result") or text.strip()) for s, (text, _) in zip(subproblems, solved, strict=True)
        ]
        final_text, final_tokens = await _work(ctx.frozen, ctx, worker_combine_prompt(record.question, steps))
        worker_tokens = sum(n for _, n in solved) + final_tokens
    else:
        final_text, worker_tokens = await _work(ctx.frozen, ctx, worker_direct_prompt(record.question))
    answer = _json_number(final_text, "final_answer") or None
    planner.finish_reason = "length" if gen.finish_reason == "length" else "stop"
    return Episode(
        main=planner,
        answer=answer,
        facts=ReasonerFacts(
            parsed=plan is not None,
            decomposed=bool(subproblems),
            subproblems=tuple(subproblems),
            planner_tokens=len(gen.token_ids),
            worker_tokens=worker_tokens,
            worker_final=final_text,
        ),
    )


@episode_reward
def reward(episode: Episode, scoring: Scoring) -> RewardResult:
    facts: ReasonerFacts = episode.facts
    golds = scoring.record.golden_answers
    independence = subproblem_independence(list(facts.subproblems), scoring.embed) if facts.decomposed else 0.5
    return recursive_reasoner_reward(
        parsed=facts.parsed,
        correct=bool(numeric_match(episode.answer, golds[0] if golds else "")),
        tokens=facts.planner_tokens + facts.worker_tokens,
        decomposed=facts.decomposed,
        independence=independence,
        token_budget=RecursiveReasonerParams.of(scoring.settings).token_budget,
    )


def numeric(record: PromptRecord, answer: str | None) -> dict[str, float]:
    golds = record.golden_answers
    return {"numeric": numeric_match(answer, golds[0]) if golds else 0.0}


# The role it trains: a planner that writes JSON, not tags (no format tags, no grammar; its reward parses the plan).
PLANNER = AgentRole("planner")

AGENTS = (
    Agent(
        "recursive-reasoner",
        run_recursive_reasoner,
        reward="agents.recursive_reasoner:reward",
        needs=frozenset({"frozen"}),
        roles=(PLANNER,),
        answer_extras=numeric,
        params=RecursiveReasonerParams,
        description="a JSON planner decomposes math problems for a frozen worker",
    ),
)
