"""``python -m tools.make_sft``: SFT demonstrations for RED from gold answers and documents the retriever ACTUALLY
returned.

Each demonstration is what the agent's rollout would build, token-in/token-out: the agent's own prompt (mask 0),
its actions (mask 1), the real retrieved documents and other observations (mask 0), its answer and EOS (mask 1).
Which actions, in which order, for which rows, is the agent's demonstration format, defined in its module
(``Agent.demonstrations``: ``agents.search_r1``'s ``search``, ``agents.coda``'s ``coda``,
``agents.naive_rag``'s ``rag``; ``agents.core.demonstrations`` holds what they share). This module reads the
rows, retrieves once for every query the format asks for, calls the format per row and writes the file:
``--agent NAME`` picks it (``--format search|coda|rag`` names it directly, as before).

``--no-think`` leaves the fixed ``<think>`` sentences out. They carry no information, and a model trained from
scratch learns to copy the question into ``<search>`` sooner without them (SFT-only probe of the tiny model on
the lookup world, same seed: held-out copy rate 0.92 at step 200 without them, 0.25 at step 275 with them).

``--hops supporting`` (the multi-hop recipes) gives each row its hop plan (``agents.plans``: a two-hop
question's searches, and what each hop asks where the row's annotations say so, 2Wiki's evidence triples); the
format decides what to do with it. ``--max-obs-tokens`` cuts each observation as the rollout's
``max_obs_tokens`` does, so a demonstration never shows more of a document than the policy will see.

Documents are never written by us (upstream CoDA fabricated documents that contained the answer and trained the
model to hallucinate them); they are masked out of the loss like every observation. A question is kept only
when the retrieved text supports its gold answer (the answer occurs in it, or for yes/no questions, a
supporting title was retrieved), so the demonstration never answers from nowhere.

    python -m tools.make_sft --model runs/tiny-model --retriever-url http://127.0.0.1:8000 \\
        --qa data/hotpotqa/qa_supported.jsonl --out runs/sft.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from agents import AGENTS, demo_format, demo_formats
from agents.core.demonstrations import DemoFormat, Question, Style, Writer
from agents.plans import plan, question_type


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
        "--agent",
        choices=sorted(n for n, a in AGENTS.items() if a.demonstrations is not None),
        default=None,
        help="the agent whose demonstration format is written (its module defines it; default: --format's)",
    )
    p.add_argument(
        "--format",
        choices=list(demo_formats()),
        default="search",
        help="the format by name, when --agent is not given: search (search-r1, thinker-searcher), coda "
        "(planner + executor), rag (naive-rag's one turn)",
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
    p.add_argument(
        "--hops",
        choices=["question", "supporting"],
        default="question",
        help="question: one search of the question per demonstration; supporting: two searches (CoDA: two "
        "delegations) for two-hop questions, read from the rows' supporting titles",
    )
    p.add_argument(
        "--max-obs-tokens",
        type=int,
        default=0,
        help="cut each observation to this many content tokens, as the rollout's max_obs_tokens (0 = whole)",
    )


def build(
    rows: list[dict],
    tok,
    retriever,
    topk: int,
    keep_unsupported: bool = False,
    fmt: DemoFormat | str = "search",
    style: Style = Style(),
    hops: str = "question",
    coverage: Counter | None = None,
) -> list[dict]:
    """Demonstrations for ``rows`` in the format ``fmt`` (a format, or an agent or format name; ``hops``:
    question, or supporting for the rows' hop plans) with one batched retrieval call for every query they show.

    ``coverage`` (when given) counts, per question type, ``questions`` and what the format counted for each:
    ``planned`` (the plan splits it), ``kept`` (a demonstration was kept; for a planned question: every hop's
    documents held what the hop needs), ``dropped`` (planned, not kept; CoDA: also a 2Wiki row without triples, not
    taught whole), ``restating`` (no plan: one task, the question) and ``unsupported`` (the question's own
    documents do not hold its answer: nothing)."""
    fmt = demo_format(fmt) if isinstance(fmt, str) else fmt
    plans = [plan(row) if hops == "supporting" else None for row in rows]
    queries = [row["question"] for row in rows] + [q for p in plans if p for q in fmt.hop_queries(p)]
    unique = list(dict.fromkeys(queries))
    found = dict(zip(unique, retriever.retrieve(unique, topk=topk), strict=True))
    writer = Writer(tok, style, keep_unsupported)
    coverage = Counter() if coverage is None else coverage
    out = []
    for row, hop_plan in zip(rows, plans, strict=True):
        written = fmt.write(writer, Question(row, hop_plan, found))
        qtype = question_type(row)
        for key in ("questions", *written.counts):
            coverage[(qtype, key)] += 1
        out += written.records
    return out


def coverage_lines(coverage: Counter) -> list[str]:
    """make-sft's coverage table: per question type, how many it planned, kept and taught by restating."""
    types = sorted({t for t, _ in coverage})
    keys = ("questions", "planned", "kept", "dropped", "restating", "unsupported")
    lines = [f"{'type':<18}" + "".join(f" {k:>11}" for k in keys)]
    for t in types:
        lines.append(f"{t:<18}" + "".join(f" {coverage[(t, k)]:>11}" for k in keys))
    return lines


def qa_rows(source: str, split: str = "all") -> list[dict]:
    """The questions of a FlashRAG JSONL file, or of a dataset the rollout names (``bundled:hotpotqa``):
    ``split`` keeps the rollout's own ``train``/``eval`` halves (same hashed prompt ids), so demonstrations
    never show the held-out questions the eval asks."""
    if split == "all" and Path(source).is_file():
        return [json.loads(line) for line in Path(source).read_text().splitlines() if line.strip()]
    from agents.datasets import load_prompts, select_split

    records = select_split(load_prompts(source), split)
    return [
        {"id": r.prompt_id, "question": r.question, "golden_answers": list(r.golden_answers), "metadata": r.metadata}
        for r in records
    ]


def run(args: argparse.Namespace) -> str:
    """Write the demonstrations; returns the one-line summary the command prints."""
    from agents.prompts import HFTokenizer, env_frame
    from shared.retriever_client import RetrieverClient

    rows = qa_rows(str(args.qa), args.split)
    if args.limit:
        rows = rows[: args.limit]
    tok = HFTokenizer(args.model, args.system_prompt)
    frame = env_frame(tok, args.env_turn)
    style = Style(args.think, frame, args.max_obs_tokens)
    fmt = demo_format(args.agent or args.format)
    with RetrieverClient(args.retriever_url) as retriever:
        coverage: Counter = Counter()
        demos = build(rows, tok, retriever, args.topk, args.keep_unsupported, fmt, style, args.hops, coverage)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(d) + "\n" for d in demos))
    tmp.replace(args.out)
    questions = {d["id"] for d in demos}
    two_hops = {d["id"] for d in demos if len(d["queries"]) > 1}
    summary = (
        f"wrote {len(demos)} demonstrations of {len(questions)} questions ({len(two_hops)} with two hops; "
        f"{len(rows) - len(questions)} questions without supporting documents skipped) to {args.out}"
    )
    return "\n".join([summary, *coverage_lines(coverage)]) if args.hops == "supporting" else summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.make_sft",
        description="Demonstrations for RED co-training: real retrieval, documents masked out of the loss.",
    )
    add_arguments(parser)
    print(run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
