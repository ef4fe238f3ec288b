"""The frozen searcher's loop: it really searches (a </think> never ends its turn), honours max_turns per
call, and falls back to a fixed message when it never answers."""

from __future__ import annotations

import pytest

from agents.prompts import SEARCHER_NO_ANSWER
from services.searcher.loop import run_searcher
from shared.protocol.search import SearchRequest
from tests.unit.agents.helpers import make_ctx, scripted


async def test_think_then_search_then_answer():
    ctx, fake = make_ctx(
        scripted(
            "<think>I need the author.</think><search> hamlet author </search>",
            "<think>Doc 1 says it.</think><answer> Shakespeare </answer>",
        )
    )
    result = await run_searcher(ctx, "who wrote hamlet", max_turns=3)
    assert result.success and result.summary == "Shakespeare" and result.num_searches == 1
    assert ctx.retriever.queries == ["hamlet author"]
    assert fake.calls[0].stop == ["</search>", "</answer>"]  # no </think>: upstream cut there, never searching
    assert "<information>Doc 1(Title:" in result.trajectory[1]


@pytest.mark.parametrize("max_turns", [1, 3])
async def test_budget_per_call_then_fixed_message(max_turns):
    ctx, fake = make_ctx(lambda prompt, model: "<search> again </search>")
    result = await run_searcher(ctx, "q", max_turns=max_turns)
    assert result.num_searches == max_turns and not result.success and result.summary == SEARCHER_NO_ANSWER
    assert len(fake.calls) == max_turns + 1  # plus the forced final turn


def test_request_validation():
    with pytest.raises(ValueError):
        SearchRequest(query="")
    with pytest.raises(ValueError):
        SearchRequest(query="x", max_turns=0)
    assert SearchRequest(query="x", extra="ignored").max_turns is None
