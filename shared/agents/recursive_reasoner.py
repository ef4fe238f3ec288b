"""Recursive reasoner: a trained JSON planner decomposes a math word problem; a frozen worker solves it.

The planner writes one JSON object (``should_decompose``, ``subproblems``, ``plan``) in a single turn; only
its tokens are trained. The frozen worker then solves each subproblem (concurrently: they are meant to be
independent) and combines the partial results, or solves the problem directly when the plan is atomic or
does not parse. Worker text never enters the planner's trajectory.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from shared.agents.context import AgentContext, Episode
from shared.agents.llm import Generator
from shared.agents.trajectory import TokenTrajectory
from shared.answers import parse_number
from shared.datasets import PromptRecord
from shared.prompts import decomposer_prompt, worker_combine_prompt, worker_direct_prompt, worker_solve_prompt
from shared.rewards.planner_json import parse_planner_json, plan_subproblems


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
    gen = await ctx.policy.generate(planner.next_prompt(), stop=[],
                                    max_tokens=min(budget.max_tokens, budget.max_context_tokens - planner.prompt_len))
    planner.add_generation(gen)
    plan = parse_planner_json(gen.text)
    subproblems = plan_subproblems(plan) if plan else []
    if subproblems:
        solved = await asyncio.gather(*(_work(ctx.frozen, ctx, worker_solve_prompt(record.question, s))
                                        for s in subproblems))
        steps = [(s, _json_number(text, "result") or text.strip()) for s, (text, _) in zip(subproblems, solved,
                                                                                            strict=True)]
        final_text, final_tokens = await _work(ctx.frozen, ctx, worker_combine_prompt(record.question, steps))
        worker_tokens = sum(n for _, n in solved) + final_tokens
    else:
        final_text, worker_tokens = await _work(ctx.frozen, ctx, worker_direct_prompt(record.question))
    answer = _json_number(final_text, "final_answer") or None
    planner.finish_reason = "length" if gen.finish_reason == "length" else "stop"
    return Episode(main=planner, answer=answer,
                   facts=ReasonerFacts(parsed=plan is not None, decomposed=bool(subproblems),
                                       subproblems=tuple(subproblems), planner_tokens=len(gen.token_ids),
                                       worker_tokens=worker_tokens, worker_final=final_text))
