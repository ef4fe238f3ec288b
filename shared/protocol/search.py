"""The searcher service's wire types: ``POST /search`` (the Thinker → frozen Searcher delegation).

Same fields as the Searcher API of the upstream Thinker–Searcher project (``docs/upstream.md``), so its
Thinker clients work unchanged; ``max_turns`` applies to that one request only (upstream wrote it into a
global, which raced when requests ran concurrently).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # old clients may send more; nothing else is needed

    query: str = Field(min_length=1, max_length=4000, description="What to find out")
    max_turns: int | None = Field(None, ge=1, le=32, description="Search turns for this request (null: server default)")


class SearchResponse(BaseModel):
    summary: str = Field(description="The searcher's final answer (a fixed message when it found none)")
    trajectory: list[str] = Field(default_factory=list, description="Each turn's text and observation, in order")
    num_searches: int = Field(0, ge=0, description="Retriever calls made")
    success: bool = Field(description="True when the searcher produced an <answer>")
