"""The retriever's wire types: ``POST /retrieve`` bodies, Search-R1 compatible.

Search-R1 and verl clients send ``{"queries": [...], "topk": 3, "return_scores": true}`` and read
``result[i][j]["document"]["contents"]``; those three fields and that shape are the contract. Our own
optional fields (``mode`` and the fusion overrides) are ignored by old servers and never needed by old
clients. Unknown request fields are ignored, as the original server does, so any Search-R1 client works.

A ``Document`` is a corpus row carried through verbatim: ``id`` and ``contents`` (``"\\"Title\\"\\nbody"``,
the wiki-18 / FlashRAG layout) plus whatever extra columns the corpus has.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

RetrievalMode = Literal["hybrid", "dense", "sparse"]
FusionMethod = Literal["minmax", "rrf", "zscore"]

DEFAULT_TOPK = 3  # every Search-R1 launch script and verl config uses 3


def split_contents(contents: str) -> tuple[str, str]:
    """``(title, text)`` the way Search-R1's clients split ``contents``: at the first newline.

    The title keeps its surrounding quotes (``'"Evan Morris"'``), exactly as Search-R1 renders it into
    prompts; strip them yourself if you want the bare title.
    """
    title, _, text = contents.partition("\n")
    return title, text


class Document(BaseModel):
    """One corpus row: ``id`` (the row index as a string), ``contents``, and any extra corpus columns."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(description="Corpus row id (the row index, as a string)")
    contents: str = Field(description="Title line in double quotes, a newline, then the passage text")

    @property
    def title(self) -> str:
        """The first line of ``contents`` with its quotes, as Search-R1 prompts show it."""
        return split_contents(self.contents)[0]

    @property
    def text(self) -> str:
        """Everything after the first line of ``contents``."""
        return split_contents(self.contents)[1]


class RetrievedDocument(Document):
    """A ``Document`` plus the score the retriever gave it: what ``shared.retriever_client`` returns."""

    score: float = Field(description="Retrieval score (fused for hybrid; higher is better)")


class ScoredDocument(BaseModel):
    """One item of a ``return_scores: true`` response: ``{"document": row, "score": float}``."""

    document: Document
    score: float


class RetrieveRequest(BaseModel):
    """``POST /retrieve``. The first three fields are Search-R1's; the rest are ours and optional."""

    model_config = ConfigDict(extra="ignore")  # Search-R1's server ignores unknown fields; so do we

    queries: list[str] = Field(description="Queries; result[i] answers queries[i]. An empty list is valid")
    topk: int | None = Field(None, ge=0, description="Documents per query; null or 0 means the server default")
    return_scores: bool = Field(False, description="true: items are {document, score}; false: bare documents")
    mode: RetrievalMode | None = Field(None, description="hybrid (default), dense or sparse")
    fusion: FusionMethod | None = Field(None, description="Hybrid fusion: minmax (default), rrf or zscore")
    sparse_weight: float | None = Field(None, ge=0, le=1, description="Convex weight of the BM25 side (minmax/zscore)")
    depth: int | None = Field(None, ge=1, description="Candidates taken from each side before fusing")
    rrf_k: float | None = Field(None, gt=0, description="RRF constant k (score = sum 1/(k + rank))")

    @field_validator("topk", "depth", mode="before")
    @classmethod
    def _no_bools(cls, value):
        if isinstance(value, bool):  # pydantic would read true as 1: almost certainly a client bug
            # A PydanticCustomError carries no exception object in its context, so the error body stays JSON.
            raise PydanticCustomError("int_not_bool", "must be an integer, not a boolean")
        return value


class RetrieveResponse(BaseModel):
    """``{"result": [[item, ...], ...]}``, one list per query, best first, at most ``topk`` long."""

    result: list[list[ScoredDocument]] | list[list[Document]]
