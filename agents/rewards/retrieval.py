"""Retrieval-quality rewards: cover-EM of the gold in ``<refine>``, information reverse-rank, and MRR."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from agents.answers import (
    YES_NO_NOANSWER,
    as_gold_list,
    cover_exact_match,
    extract_all_tags,
    normalize_answer,
)

_CHUNK_SUFFIX = re.compile(r"_chunk_\d+$")


def refine_score(generated: str, golds: str | Iterable[str]) -> float:
    """``cover_em(" ".join(all <refine> contents), golds)``; 0.0 without a ``<refine>``.

    ``generated`` is the executor's own turns (``TokenTrajectory.generated_text``), not its documents.
    """
    refines = extract_all_tags(generated, "refine")
    return cover_exact_match(" ".join(refines), golds) if refines else 0.0


def information_reverse_rank(blocks: Sequence[str], golds: str | Iterable[str], yes_no_value: float = 0.5) -> float:
    """``Σ_idx 1/(idx+1) · cover_em(block_idx, golds)`` over the retrieved blocks, in order (idx from 0).

    ``blocks`` are the contents of the observations the retriever returned (``observations("documents")``),
    not tag blocks parsed out of text, so a policy that writes its own ``<documents>`` earns nothing.
    Rewards finding the gold early and often. When every gold is yes/no/noanswer the documents cannot contain
    it, so the score is the constant ``yes_no_value``. (Upstream CoDA scored prompt+response and skipped the
    first block because the prompt mentions the tag.)
    """
    golds = as_gold_list(golds)
    if not blocks:
        return 0.0
    if golds and all(normalize_answer(g) in YES_NO_NOANSWER for g in golds):
        return yes_no_value
    return sum(1.0 / (i + 1) for i, block in enumerate(blocks) if cover_exact_match(block, golds))


def document_id(chunk_id: str) -> str:
    """Document id of a chunk id: ``"0000012_chunk_3"`` → ``"0000012"`` (ids without the suffix pass through)."""
    return _CHUNK_SUFFIX.sub("", chunk_id)


def reciprocal_rank(retrieved_ids: Sequence[str], gold_ids: Iterable[str], strip_chunks: bool = True) -> float:
    """``1/(1 + rank)`` of the first retrieved id in ``gold_ids`` (rank from 0), else 0.0."""
    gold = set(gold_ids)
    for rank, rid in enumerate(retrieved_ids):
        if (document_id(rid) if strip_chunks else rid) in gold:
            return 1.0 / (1 + rank)
    return 0.0


def mrr(calls: Sequence[Sequence[str]], gold_ids: Iterable[str], strip_chunks: bool = True) -> float:
    """Best reciprocal rank over the episode's retrieval calls: ``max_call 1/(1 + rank of a gold id)``, else 0.

    ``calls`` holds one ranked id list per search call, in the order the retriever returned them.
    """
    gold = set(gold_ids)
    return max((reciprocal_rank(ids, gold, strip_chunks) for ids in calls), default=0.0)
