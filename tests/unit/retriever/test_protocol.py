"""The retrieval wire types: Search-R1's request shape, our optional fields, clear errors."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.protocol.retrieval import RetrievedDocument, RetrieveRequest, RetrieveResponse


def test_search_r1_request_and_defaults():
    body = RetrieveRequest.model_validate({"queries": ["a", ""], "topk": 3, "return_scores": True, "x": 1})
    assert body.queries == ["a", ""] and body.topk == 3 and body.return_scores and body.mode is None
    assert RetrieveRequest(queries=[]).return_scores is False  # the original's default


@pytest.mark.parametrize(
    "bad",
    [
        {"queries": ["a"], "topk": -1},
        {"queries": ["a"], "topk": True},
        {"queries": "a"},
        {"queries": ["a"], "mode": "both"},
        {"queries": ["a"], "sparse_weight": -0.1},
        {"queries": ["a"], "rrf_k": 0},
    ],
)
def test_bad_requests(bad):
    with pytest.raises(ValidationError):
        RetrieveRequest.model_validate(bad)


def test_response_items_and_retrieved_document():
    scored = RetrieveResponse.model_validate(
        {"result": [[{"document": {"id": "4", "contents": '"T"\nx\ny', "src": "s"}, "score": 1.5}]]}
    )
    doc = scored.result[0][0].document
    assert (doc.title, doc.text, doc.model_extra) == ('"T"', "x\ny", {"src": "s"})
    hit = RetrievedDocument(id="4", contents='"T"\nx', score=0.5)
    assert hit.title == '"T"' and hit.score == 0.5
