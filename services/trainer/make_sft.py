"""``make-sft``: SFT demonstrations for RED from gold answers and documents the retriever ACTUALLY returned.

Each demonstration follows the flat search protocol, token-in/token-out exactly as a rollout would build it:

    prompt (mask 0) → "<think>…</think><search> question </search>" (mask 1)
    → "<information>" + the real top-k documents + "</information>" (mask 0)
    → "<think>…</think><answer> gold </answer>" + EOS (mask 1)

``--no-think`` leaves the fixed ``<think>`` sentences out. They carry no information, and a model trained from
scratch learns to copy the question into ``<search>`` sooner without them (SFT-only probe of the tiny model on
the lookup world, same seed: held-out copy rate 0.92 at step 200 without them, 0.25 at step 275 with them).

With ``--format coda`` each question gives two demonstrations in the hierarchical protocol instead: the
executor's (``<search>`` → ``<documents>`` (mask 0) → ``<refine>`` quoting the retrieved sentence that holds
the answer → ``<answer>``) and the planner's (``<task>`` → ``<result>`` with the executor's answer (mask 0) →
``<answer>``), so co-training teaches the format the CoDA loop runs (upstream CoDA's SFT data never
used ``<task>``; ``docs/upstream.md``).

Documents are never written by us (upstream CoDA fabricated documents that contained the answer and trained the
model to hallucinate them); they are masked out of the loss like every observation. A question is kept only
when the retrieved text supports its gold answer (the answer occurs in it, or for yes/no questions, a
supporting title was retrieved), so the demonstration never answers from nowhere.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from recipes.answers import as_gold_list, normalize_answer
from recipes.core.tokenizer import INLINE
from recipes.prompts import (
    OBSERVATION_WRAP,
    executor_messages,
    format_documents,
    planner_messages,
    search_agent_messages,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model folder whose tokenizer encodes the demonstrations")
    p.add_argument("--retriever-url", required=True, help="retriever base URL (POST /retrieve)")
    p.add_argument(
        "--qa",
        default="data/hotpotqa/qa_supported.jsonl",
        help="QA JSONL with id, question, golden_answers (FlashRAG layout), or a rollout dataset (bundled:NAME)",
    )
    p.add_argument("--out", type=Path, required=True, help="demonstrations JSONL to write")
    p.add_argument("--topk", type=int, default=3, help="documents per search (default 3)")
    p.add_argument(
        "--format",
        choices=["search", "coda"],
        default="search",
        help="flat search agent (search-r1, thinker) or CoDA planner + executor demonstrations",
    )
    p.add_argument(
        "--no-think",
        dest="think",
        action="store_false",
        help="leave out the fixed <think> sentences before each action",
    )
    p.add_argument("--limit", type=int, default=0, help="use at most this many questions (0 = all)")
    p.add_argument(
        "--system-prompt",
        default=None,
        help="system turn of every prompt (as the rollout's [rollout] system_prompt; default: the template's)",
    )
    p.add_argument(
        "--env-turn",
        choices=["inline", "user", "tool"],
        default="inline",
        help="where observations go (as the rollout's [rollout] env_turn): inline, or a user/tool chat turn",
    )
    p.add_argument(
        "--split",
        default="all",
        help="all, or the rollout's hashed train/eval half of --qa (then --qa may be bundled:NAME)",
    )
    p.add_argument(
        "--keep-unsupported",
        action="store_true",
        help="keep questions whose retrieved documents do not support the answer",
    )


def supported(docs_text: str, golds: list[str], titles: list[str], supporting: list[str]) -> bool:
    """True when the retrieved documents back the gold answer (see the module docstring)."""
    text = f" {normalize_answer(docs_text)} "
    if any(normalize_answer(g) in ("yes", "no") for g in golds):
        return bool(set(titles) & set(supporting))
    return any(f" {normalize_answer(g)} " in text for g in golds if normalize_answer(g))


def _assemble(tok, pieces: list[tuple[list[int], int]]) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    mask: list[int] = []
    for part, m in pieces:
        ids += part
        mask += [m] * len(part)
    if tok.eos_token_id is not None:
        ids.append(tok.eos_token_id)
        mask.append(1)
    return ids, mask


def _thought(text: str, think: bool) -> str:
    return f"<think> {text} </think>\n" if think else ""


def demonstration(
    tok, question: str, gold: str, docs_text: str, think: bool = True, frame: tuple[str, str] = INLINE
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of one flat search demonstration (layout in the module docstring); ``frame``
    goes around the observation as the rollout's ``env_turn`` puts it (``recipes.core.tokenizer.env_frame``)."""
    before, after = OBSERVATION_WRAP["information"]
    before, after = frame[0] + before, after + frame[1]
    return _assemble(
        tok,
        [
            (tok.render(search_agent_messages(question)), 0),
            (tok.encode(f"{_thought('I should look this up.', think)}<search> {question.strip()} </search>"), 1),
            (tok.encode(f"{before}{docs_text}{after}"), 0),
            (tok.encode(f"{_thought('The passages give the answer.', think)}<answer> {gold} </answer>"), 1),
        ],
    )


def evidence(passages: list[str], gold: str) -> str:
    """The retrieved sentence that contains the answer (else the top passage's first sentence)."""
    sentences = [x.strip() for p in passages for x in re.split(r"(?<=[.!?])\s+|\n", p) if x.strip()]
    for sentence in sentences:
        if gold.lower() in sentence.lower():
            return sentence
    return sentences[0] if sentences else ""


def coda_demonstrations(
    tok,
    question: str,
    gold: str,
    docs_text: str,
    passages: list[str],
    think: bool = True,
    frame: tuple[str, str] = INLINE,
) -> list[tuple[str, list[int], list[int]]]:
    """``(role, ids, mask)`` of the executor's and the planner's demonstration for one question."""
    d_before, d_after = OBSERVATION_WRAP["documents"]
    r_before, r_after = OBSERVATION_WRAP["result"]
    d_before, d_after, r_before, r_after = (
        frame[0] + d_before,
        d_after + frame[1],
        frame[0] + r_before,
        r_after + frame[1],
    )
    executor = _assemble(
        tok,
        [
            (tok.render(executor_messages(question)), 0),
            (tok.encode(f"{_thought('I need to search for this.', think)}<search> {question.strip()} </search>"), 1),
            (tok.encode(f"{d_before}{docs_text}{d_after}"), 0),
            (tok.encode(f"<refine> {evidence(passages, gold)} </refine>\n<answer> {gold} </answer>"), 1),
        ],
    )
    planner = _assemble(
        tok,
        [
            (tok.render(planner_messages(question)), 0),
            (
                tok.encode(
                    f"{_thought('One fact settles this; I will ask for it.', think)}<task> {question.strip()} </task>"
                ),
                1,
            ),
            (tok.encode(f"{r_before}{gold}{r_after}"), 0),
            (tok.encode(f"{_thought('The helper found the answer.', think)}<answer> {gold} </answer>"), 1),
        ],
    )
    return [("executor", *executor), ("planner", *planner)]


def build(
    rows: list[dict],
    tok,
    retriever,
    topk: int,
    keep_unsupported: bool = False,
    fmt: str = "search",
    think: bool = True,
    frame: tuple[str, str] = INLINE,
) -> list[dict]:
    """Demonstrations for ``rows`` with one batched retrieval call for all questions."""
    results = retriever.retrieve([r["question"] for r in rows], topk=topk)
    out = []
    for row, docs in zip(rows, results, strict=True):
        golds = as_gold_list(row["golden_answers"])
        docs_text = format_documents([(d.title, d.text) for d in docs])
        supporting = (row.get("metadata") or {}).get("supporting_titles", [])
        if not keep_unsupported and not supported(docs_text, golds, [d.title.strip('"') for d in docs], supporting):
            continue
        if fmt == "coda":
            demos = coda_demonstrations(tok, row["question"], golds[0], docs_text, [d.text for d in docs], think, frame)
        else:
            demos = [("policy", *demonstration(tok, row["question"], golds[0], docs_text, think, frame))]
        for role, ids, mask in demos:
            out.append(
                {
                    "id": row.get("id"),
                    "role": role,
                    "token_ids": ids,
                    "loss_mask": mask,
                    "doc_ids": [d.id for d in docs],
                    "answer": golds[0],
                }
            )
    return out


def qa_rows(source: str, split: str = "all") -> list[dict]:
    """The questions of a FlashRAG JSONL file, or of a dataset the rollout names (``bundled:hotpotqa``):
    ``split`` keeps the rollout's own ``train``/``eval`` halves (same hashed prompt ids), so demonstrations
    never show the held-out questions the eval asks."""
    if split == "all" and Path(source).is_file():
        return [json.loads(line) for line in Path(source).read_text().splitlines() if line.strip()]
    from recipes.datasets import load_prompts, select_split

    records = select_split(load_prompts(source), split)
    return [
        {"id": r.prompt_id, "question": r.question, "golden_answers": list(r.golden_answers), "metadata": r.metadata}
        for r in records
    ]


def run(args: argparse.Namespace) -> str:
    """Write the demonstrations; returns the one-line summary the command prints."""
    from recipes.core.tokenizer import HFTokenizer, env_frame
    from shared.retriever_client import RetrieverClient

    rows = qa_rows(str(args.qa), args.split)
    if args.limit:
        rows = rows[: args.limit]
    tok = HFTokenizer(args.model, args.system_prompt)
    frame = env_frame(tok, args.env_turn)
    with RetrieverClient(args.retriever_url) as retriever:
        demos = build(rows, tok, retriever, args.topk, args.keep_unsupported, args.format, args.think, frame)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(d) + "\n" for d in demos))
    tmp.replace(args.out)
    return (
        f"wrote {len(demos)} demonstrations ({len(rows) - len(demos)} questions without supporting "
        f"documents skipped) to {args.out}"
    )
