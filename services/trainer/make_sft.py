"""``make-sft``: SFT demonstrations for RED from gold answers and documents the retriever ACTUALLY returned.

Each demonstration follows the flat search protocol, token-in/token-out exactly as a rollout would build it:

    prompt (mask 0) → "<think>…</think><search> question </search>" (mask 1)
    → "<information>" + the real top-k documents + "</information>" (mask 0)
    → "<think>…</think><answer> gold </answer>" + EOS (mask 1)

Documents are never written by us (a seed fabricated documents that contained the answer and trained the
model to hallucinate them); they are masked out of the loss like every observation. A question is kept only
when the retrieved text supports its gold answer (the answer occurs in it, or for yes/no questions, a
supporting title was retrieved), so the demonstration never answers from nowhere.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from shared.answers import as_gold_list, normalize_answer
from shared.prompts import OBSERVATION_WRAP, format_documents, search_agent_messages


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model folder whose tokenizer encodes the demonstrations")
    p.add_argument("--retriever-url", required=True, help="retriever base URL (POST /retrieve)")
    p.add_argument("--qa", type=Path, default=Path("data/hotpotqa/qa_supported.jsonl"),
                   help="QA JSONL with id, question, golden_answers (FlashRAG layout)")
    p.add_argument("--out", type=Path, required=True, help="demonstrations JSONL to write")
    p.add_argument("--topk", type=int, default=3, help="documents per search (default 3)")
    p.add_argument("--limit", type=int, default=0, help="use at most this many questions (0 = all)")
    p.add_argument("--keep-unsupported", action="store_true",
                   help="keep questions whose retrieved documents do not support the answer")


def supported(docs_text: str, golds: list[str], titles: list[str], supporting: list[str]) -> bool:
    """True when the retrieved documents back the gold answer (see the module docstring)."""
    text = f" {normalize_answer(docs_text)} "
    if any(normalize_answer(g) in ("yes", "no") for g in golds):
        return bool(set(titles) & set(supporting))
    return any(f" {normalize_answer(g)} " in text for g in golds if normalize_answer(g))


def demonstration(tok, question: str, gold: str, docs_text: str) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of one demonstration (layout in the module docstring)."""
    before, after = OBSERVATION_WRAP["information"]
    pieces = [
        (tok.render(search_agent_messages(question)), 0),
        (tok.encode(f"<think> I should look this up. </think>\n<search> {question.strip()} </search>"), 1),
        (tok.encode(f"{before}{docs_text}{after}"), 0),
        (tok.encode(f"<think> The passages give the answer. </think>\n<answer> {gold} </answer>"), 1),
    ]
    ids: list[int] = []
    mask: list[int] = []
    for part, m in pieces:
        ids += part
        mask += [m] * len(part)
    if tok.eos_token_id is not None:
        ids.append(tok.eos_token_id)
        mask.append(1)
    return ids, mask


def build(rows: list[dict], tok, retriever, topk: int, keep_unsupported: bool = False) -> list[dict]:
    """Demonstrations for ``rows`` with one batched retrieval call for all questions."""
    results = retriever.retrieve([r["question"] for r in rows], topk=topk)
    out = []
    for row, docs in zip(rows, results, strict=True):
        golds = as_gold_list(row["golden_answers"])
        docs_text = format_documents([(d.title, d.text) for d in docs])
        supporting = (row.get("metadata") or {}).get("supporting_titles", [])
        if not keep_unsupported and not supported(docs_text, golds, [d.title.strip('"') for d in docs], supporting):
            continue
        ids, mask = demonstration(tok, row["question"], golds[0], docs_text)
        out.append({"id": row.get("id"), "token_ids": ids, "loss_mask": mask, "doc_ids": [d.id for d in docs],
                    "answer": golds[0]})
    return out


def run(args: argparse.Namespace) -> int:
    from shared.agents.tokenizer import HFTokenizer
    from shared.retriever_client import RetrieverClient

    rows = [json.loads(line) for line in args.qa.read_text().splitlines() if line.strip()]
    if args.limit:
        rows = rows[: args.limit]
    tok = HFTokenizer(args.model)
    with RetrieverClient(args.retriever_url) as retriever:
        demos = build(rows, tok, retriever, args.topk, args.keep_unsupported)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(d) + "\n" for d in demos))
    tmp.replace(args.out)
    print(f"wrote {len(demos)} demonstrations ({len(rows) - len(demos)} questions without supporting "
          f"documents skipped) to {args.out}")
    return 0
