"""Naive RAG: retrieve the top-k passages for the question itself, answer in one turn (no search actions).

The obvious baseline a search agent must beat (``bench/qa.py`` method b): one retriever call with the question
as the query, the passages in the prompt (``prompts.rag_messages``), one completion. The answer is the text
between ``<answer>`` tags when the model writes them, else the completion's first non-empty line. Its reward
is single-turn's (the answer metric). It trains like any agent (GRPO on the completion's tokens); the benchmark
runs it untrained (zero- and few-shot) and fine-tuned on demonstrations of its own format (RAG + SFT).
"""

from __future__ import annotations

from recipes.answers import extract_answer
from recipes.base import Agent
from recipes.core.context import AgentContext, Episode, SearchTrace
from recipes.datasets import PromptRecord
from recipes.prompts import rag_messages
from recipes.single_turn import SingleTurnParams, complete_once


async def run_naive_rag(ctx: AgentContext, record: PromptRecord) -> Episode:
    if ctx.retriever is None:
        raise RuntimeError("naive-rag needs a retriever")
    (docs,) = await ctx.retriever.retrieve([record.question], topk=ctx.topk)
    traj, text = await complete_once(ctx, record, rag_messages(record.question, [(d.title, d.text) for d in docs]))
    answer = extract_answer(text) or next((line.strip() for line in text.splitlines() if line.strip()), None)
    return Episode(main=traj, answer=answer, search=SearchTrace.of([record.question], [[d.id for d in docs]]))


AGENTS = (
    Agent(
        "naive-rag",
        run_naive_rag,
        reward="recipes.single_turn:reward",  # the answer metric alone: there is no protocol to score
        needs=frozenset({"retriever"}),
        metric="f1",
        params=SingleTurnParams,  # its stop strings
        demonstrations="rag",  # make-sft: the passages and the question, then the answer alone
        description="top-k passages for the question, one answer turn (a baseline of bench/qa.py)",
    ),
)
