"""Naive RAG: retrieve the top-k passages for the question itself, answer in one turn (no search actions).

The obvious baseline a search agent must beat (``bench/qa.py`` method b): one retriever call with the question
as the query, the passages in the prompt (``prompts.rag_messages``), one completion. The answer is the text
between ``<answer>`` tags when the model writes them, else the completion's first non-empty line. Its reward
is single-turn's (the answer metric). It trains like any agent (GRPO on the completion's tokens); the benchmark
runs it untrained (zero- and few-shot) and fine-tuned on demonstrations of its own format (RAG + SFT).

Demonstrations (make-sft's ``rag`` format): the question's top-k passages and the question in the prompt (mask 0),
then the answer alone, as its instructions ask (no tags, no search action); kept when the passages, shown whole,
hold the answer. One turn has no hops: a hop plan is not used.
"""

from __future__ import annotations

from collections.abc import Sequence

from agents.answers import extract_answer
from agents.base import Agent
from agents.core.demonstrations import Demo, DemoFormat, Question, Writer, Written, assemble
from agents.core.episode import AgentContext, Episode, SearchTrace
from agents.datasets import PromptRecord
from agents.prompts import rag_messages
from agents.single_turn import SingleTurnParams, complete_once


async def run_naive_rag(ctx: AgentContext, record: PromptRecord) -> Episode:
    if ctx.retriever is None:
        raise RuntimeError("naive-rag needs a retriever")
    (docs,) = await ctx.retriever.retrieve([record.question], topk=ctx.topk)
    traj, text = await complete_once(ctx, record, rag_messages(record.question, [(d.title, d.text) for d in docs]))
    answer = extract_answer(text) or next((line.strip() for line in text.splitlines() if line.strip()), None)
    return Episode(main=traj, answer=answer, search=SearchTrace.of([record.question], [[d.id for d in docs]]))


def rag_demonstration(tok, question: str, docs: Sequence[tuple[str, str]], gold: str) -> Demo:
    """Naive RAG in one turn: the question's passages and the question, then the answer alone."""
    return assemble(tok, [(tok.render(rag_messages(question, docs)), 0), (tok.encode(gold), 1)])


def write_demonstrations(w: Writer, q: Question) -> Written:
    search = w.question_search(q, whole=True)  # naive RAG shows its passages whole
    if search is None:
        return Written([], ("unsupported",))
    docs = [(d.title, d.text) for d in q.found[q.text]]
    demo = rag_demonstration(w.tok, q.text, docs, q.golds[0])
    return Written([q.record("policy", demo, q.golds[0], [search])], ("kept",))


DEMONSTRATIONS = DemoFormat(
    "rag", write_demonstrations, prompts=lambda: rag_messages("{question}", [("{title}", "{text}")])
)

AGENTS = (
    Agent(
        "naive-rag",
        run_naive_rag,
        reward="agents.single_turn:reward",  # the answer metric alone: there is no protocol to score
        needs=frozenset({"retriever"}),
        metric="f1",
        params=SingleTurnParams,  # its stop strings
        demonstrations=DEMONSTRATIONS,
        description="top-k passages for the question, one answer turn (a baseline of bench/qa.py)",
    ),
)
