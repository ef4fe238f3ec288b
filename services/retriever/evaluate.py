"""``eval``: recall of dense, sparse and hybrid retrieval on a QA file with gold passages.

Metrics, each at k = 1, 3, 5, 10, 20:
- ``sup@k``: mean fraction of a question's gold passages (``metadata.supporting_doc_ids``) in its top-k;
- ``both@k``: share of questions with every gold passage in the top-k;
- ``ans@k``: FlashRAG's ``retrieval_recall``: a normalised golden answer occurs in some top-k passage,
  over the questions whose answer is not yes/no.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from agents.answers import normalize_answer
from services.retriever.corpus import CorpusStore, read_jsonl
from services.retriever.engine import Retriever, SearchSpec

KS = (1, 3, 5, 10, 20)
MODES = ("dense", "sparse", "hybrid")


def load_qa(path) -> list[dict]:
    return list(read_jsonl(path))


def recall_at(
    ids: np.ndarray,
    golds: list[set[int]],
    answers: list[list[str] | None],
    contents: dict[int, str],
    ks: Iterable[int] = KS,
) -> dict[str, float]:
    """``sup@k``/``both@k`` over questions with gold ids, ``ans@k`` over those with non-yes/no answers."""
    out: dict[str, float] = {}
    for k in ks:
        top = [set(row[:k][row[:k] >= 0].tolist()) for row in ids]
        with_gold = [(t, g) for t, g in zip(top, golds, strict=True) if g]
        if with_gold:
            out[f"sup@{k}"] = float(np.mean([len(t & g) / len(g) for t, g in with_gold]))
            out[f"both@{k}"] = float(np.mean([g <= t for t, g in with_gold]))
        scored = [(row, a) for row, a in zip(ids, answers, strict=True) if a]
        if scored:
            hits = [any(gold in contents[d] for d in row[:k].tolist() if d >= 0 for gold in a) for row, a in scored]
            out[f"ans@{k}"] = float(np.mean(hits))
    return out


def gold_rows(qa: list[dict], corpus: CorpusStore) -> list[set[int]]:
    """Each question's gold passages (``metadata.supporting_doc_ids``) as corpus row positions."""
    id_to_row = {corpus.row(i)["id"]: i for i in range(len(corpus))}
    return [
        {id_to_row[d] for d in (q.get("metadata", {}).get("supporting_doc_ids") or []) if d in id_to_row} for q in qa
    ]


def answer_lists(qa: list[dict]) -> list[list[str] | None]:
    """Normalised golden answers per question; None for yes/no questions (no string to look for)."""
    out = []
    for q in qa:
        golds = [normalize_answer(a) for a in q.get("golden_answers", [])]
        yes_no = q.get("metadata", {}).get("answer_is_yes_no") or set(golds) <= {"yes", "no"}
        out.append(None if yes_no or not any(golds) else [g for g in golds if g])
    return out


def normalised_contents(corpus: CorpusStore, id_arrays: Iterable[np.ndarray]) -> dict[int, str]:
    """``normalize_answer(contents)`` of every row that appears in the given result ids."""
    needed = {int(d) for ids in id_arrays for d in np.unique(ids) if d >= 0}
    return {d: normalize_answer(corpus.contents(d)) for d in needed}


def evaluate(retriever: Retriever, qa: list[dict], modes: Iterable[str] = MODES, **options) -> dict[str, dict]:
    """``{mode: {metric: value}}`` on ``qa`` (FlashRAG layout). All modes go in one batch: one encode."""
    golds, answers = gold_rows(qa, retriever.corpus), answer_lists(qa)
    questions = [q["question"] for q in qa]
    modes = list(modes)
    results = retriever.search_many([SearchSpec(questions, max(KS), mode, **options) for mode in modes])
    contents = normalised_contents(retriever.corpus, [ids for ids, _ in results])
    return {mode: recall_at(ids, golds, answers, contents) for mode, (ids, _) in zip(modes, results, strict=True)}


def format_table(table: dict[str, dict]) -> str:
    """A Markdown table, one row per mode."""
    first = next(iter(table.values()))
    metrics = [m for family in ("sup", "both", "ans") for m in first if m.startswith(family + "@")]
    lines = ["| mode | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    for mode, row in table.items():
        lines.append(f"| {mode} | " + " | ".join(f"{row[m]:.3f}" for m in metrics) + " |")
    return "\n".join(lines)
