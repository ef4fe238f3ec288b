"""Evidence triples for the bundled datasets' train rows, read from their gold paragraphs.

The rows of ``bundled:2wiki-dev`` and ``bundled:hotpotqa-dev`` name their gold paragraphs by corpus id
(``supporting_doc_ids``); a comparison without evidence triples gets them from those paragraphs' text
(``agents.plan_values``, ``agents.hotpot_values``). ``agents.datasets`` imports this module only when it loads
such a dataset.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import lzma
from pathlib import Path

from agents.datasets import BUNDLED, HELDOUT, PromptRecord

log = logging.getLogger(__name__)


@functools.cache
def _paragraphs(corpus: Path) -> dict[str, tuple[str, str]]:
    """A bundled corpus by id: (title, paragraph), from rows ``{"id", "contents": "\"<title>\"\n<paragraph>"}``."""
    out = {}
    with lzma.open(corpus, "rt") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                title, _, text = str(row["contents"]).partition("\n")
                out[str(row["id"])] = (title.strip().strip('"'), text)
    return out


def _paragraph_reader(name: str):
    """The reader of a bundled dataset's comparison values from its gold paragraphs (None: no such reader)."""
    if name == "2wiki-dev":
        from agents.plan_values import paragraph_evidences
    elif name == "hotpotqa-dev":
        from agents.hotpot_values import paragraph_evidences
    else:
        return None
    return paragraph_evidences


def with_paragraph_evidences(records: list[PromptRecord], name: str = "2wiki-dev") -> list[PromptRecord]:
    """Train rows whose comparison has no evidence triples (2Wiki's fifth without them, every HotpotQA one) get
    them read from their gold paragraphs (``agents.plan_values``, ``agents.hotpot_values``), so make-sft and the
    rollout's per-role reward plan them alike. Held-out rows are left as they are: their annotations never
    reach training."""
    reader = _paragraph_reader(name)
    if reader is None:
        return records
    corpus = BUNDLED[name].parent / "corpus.jsonl.xz"
    if not corpus.is_file():
        log.warning("%s missing: %s comparisons without evidence triples stay without a plan", corpus, name)
        return records
    paragraphs = _paragraphs(corpus)
    out = []
    for r in records:
        ids = r.metadata.get("supporting_doc_ids") or []
        if r.split == HELDOUT or r.metadata.get("evidences") or not ids:
            out.append(r)
            continue
        docs = dict(paragraphs[str(i)] for i in ids if str(i) in paragraphs)
        row = {"question": r.question, "golden_answers": r.golden_answers, "metadata": r.metadata}
        evidences = reader(row, docs)
        if evidences is None:
            out.append(r)
            continue
        meta = {**r.metadata, "evidences": evidences, "evidences_source": "paragraphs"}
        out.append(dataclasses.replace(r, metadata=meta))
    return out
