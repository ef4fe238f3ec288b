"""make-sft's ``--format rag``: naive RAG's one turn as a demonstration, replayed through the naive-rag agent (the
rollout that writes the demonstrated answer builds the same ids and mask and scores the gold)."""

from __future__ import annotations

from agents import demo_format, get_agent
from agents.base import Scoring
from agents.core.turns import Budget
from agents.datasets import PromptRecord
from agents.single_turn import reward as single_turn_reward
from tests.unit.agents.helpers import VLLMLikeGenerator, make_ctx
from tests.unit.trainer.test_two_hop_demos import ADA, BRIDGE, MARROW, PEN, AsyncRetriever, Retriever, tok  # noqa: F401
from tools.make_sft import build

FOUND = {BRIDGE["question"]: [ADA, MARROW]}


async def test_a_rag_demonstration_is_the_naive_rag_turn_that_answers_the_gold(tok):  # noqa: F811
    (demo,) = build([BRIDGE], tok, Retriever(FOUND), topk=2, fmt="rag")
    answer = tok.decode([t for t, m in zip(demo["token_ids"][:-1], demo["loss_mask"][:-1], strict=True) if m])
    assert answer == BRIDGE["golden_answers"][0]  # the answer alone, as the RAG instructions ask
    assert demo["loss_mask"][-1] == 1 and demo["token_ids"][-1] == tok.eos_token_id  # it learns to stop
    ctx, _ = make_ctx(lambda prompt, model: "")
    ctx.tok, ctx.topk, ctx.retriever = tok, 2, AsyncRetriever(FOUND)
    ctx.policy = VLLMLikeGenerator(tok, lambda prompt: answer)
    ctx.budgets["policy"] = Budget(max_turns=1, max_tokens=64, max_context_tokens=20000)
    record = PromptRecord(prompt_id="q", question=BRIDGE["question"], golden_answers=BRIDGE["golden_answers"])
    episode = await get_agent("naive-rag").run(ctx, record)
    # Its EOS too: the one turn ends where the model stops (the search agents end on a stop string instead).
    assert demo["token_ids"] == episode.main.ids and demo["loss_mask"] == episode.main.mask
    assert single_turn_reward(episode, Scoring(record=record, settings=None, metric="f1")).reward == 1.0


def test_a_rag_demonstration_needs_passages_that_hold_the_answer(tok):  # noqa: F811
    assert build([BRIDGE], tok, Retriever({BRIDGE["question"]: [ADA, PEN]}), topk=2, fmt="rag") == []


def test_the_rag_format_has_its_own_cache_key():
    assert len({demo_format(f).fingerprint() for f in ("search", "coda", "rag")}) == 3
