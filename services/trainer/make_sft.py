"""``make-sft``: SFT demonstrations for RED from gold answers and documents the retriever ACTUALLY returned.

Each demonstration follows the flat search protocol, token-in/token-out exactly as a rollout would build it
(``services.trainer.demonstrations`` assembles them):

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
used ``<task>``; ``docs/upstream.md``). With ``--format rag``, naive RAG's one turn (``recipes.naive_rag``): the
question's top-k passages and the question in the prompt (mask 0), then the answer alone.

``--hops supporting`` (the multi-hop recipes) shows each hop of a two-hop question (``recipes.plans``):
the flat agent searches twice (a bridge question: the question, then the bridge entity; a comparison: each
compared entity), each search followed by what the retriever returned for it; the CoDA planner delegates one
sub-question per hop, each to its own executor, when the row's annotations say what the hops ask (2Wiki's
evidence triples). A two-hop demonstration is kept only when each search brought back the supporting paragraph
it is for (each executor's documents, its answer); otherwise, and for every other question, the one-search
demonstration above. ``--max-obs-tokens`` cuts each observation as the rollout's ``max_obs_tokens``
does, so a demonstration never shows more of a document than the policy will see.

Documents are never written by us (upstream CoDA fabricated documents that contained the answer and trained the
model to hallucinate them); they are masked out of the loss like every observation. A question is kept only
when the retrieved text supports its gold answer (the answer occurs in it, or for yes/no questions, a
supporting title was retrieved), so the demonstration never answers from nowhere.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from recipes.answers import as_gold_list, normalize_answer
from recipes.plans import HopPlan, plan, question_type
from services.trainer.demonstrations import (
    Search,
    Style,
    executor_demonstration,
    planner_demonstration,
    rag_demonstration,
    search_demonstration,
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
        choices=["search", "coda", "rag"],
        default="search",
        help="flat search agent (search-r1, thinker), CoDA planner + executor, or naive RAG in one turn (the "
        "question's passages in the prompt, the answer alone) demonstrations",
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


def supported(docs_text: str, golds: list[str], titles: list[str], supporting: list[str]) -> bool:
    """True when the retrieved documents back the gold answer (see the module docstring)."""
    text = f" {normalize_answer(docs_text)} "
    if any(normalize_answer(g) in ("yes", "no") for g in golds):
        return bool(set(titles) & set(supporting))
    return any(f" {normalize_answer(g)} " in text for g in golds if normalize_answer(g))


def build(
    rows: list[dict],
    tok,
    retriever,
    topk: int,
    keep_unsupported: bool = False,
    fmt: str = "search",
    style: Style = Style(),
    hops: str = "question",
    coverage: Counter | None = None,
) -> list[dict]:
    """Demonstrations for ``rows`` (``fmt``: search or coda; ``hops``: question, or supporting for two-hop
    demonstrations where a row allows one) with one batched retrieval call for every query they show.

    ``coverage`` (when given) counts, per question type, ``questions``, ``planned`` (the plan splits it),
    ``kept`` (its split demonstration was kept: every hop's documents held what the hop needs), ``dropped``
    (planned, not kept: no planner demonstration at all), ``restating`` (no plan: one task, the question) and
    ``unsupported`` (no plan, and the question's own documents do not hold its answer: nothing)."""
    plans = [plan(row) if hops == "supporting" else None for row in rows]
    queries = [row["question"] for row in rows] + [q for p in plans if p for q in _queries(p, fmt)]
    unique = list(dict.fromkeys(queries))
    found = dict(zip(unique, retriever.retrieve(unique, topk=topk), strict=True))
    coverage = Counter() if coverage is None else coverage
    out = []
    for row, hop_plan in zip(rows, plans, strict=True):
        golds = as_gold_list(row["golden_answers"])
        qtype = question_type(row)
        coverage[(qtype, "questions")] += 1
        if fmt == "coda" and hop_plan is not None and hop_plan.tasks:
            # A question the data splits is never taught as a restated task: without every hop, no planner
            # demonstration (the executors whose hop did find its result still teach searching for it).
            demos = _delegations(tok, row, golds, hop_plan, found, style)
            planner = any(d["role"] == "planner" for d in demos)
            coverage[(qtype, "planned")] += 1
            coverage[(qtype, "kept" if planner else "dropped")] += 1
            out += demos
            continue
        demos = _two_hops(tok, row, golds, hop_plan, found, fmt, style) if hop_plan else []
        demos = demos or _one_search(tok, row, golds, found[row["question"]], fmt, style, keep_unsupported)
        coverage[(qtype, "restating" if fmt == "coda" and demos else "kept" if demos else "unsupported")] += 1
        out += demos
    return out


def coverage_lines(coverage: Counter) -> list[str]:
    """make-sft's coverage table: per question type, how many it planned, kept and taught by restating."""
    types = sorted({t for t, _ in coverage})
    keys = ("questions", "planned", "kept", "dropped", "restating", "unsupported")
    lines = [f"{'type':<18}" + "".join(f" {k:>11}" for k in keys)]
    for t in types:
        lines.append(f"{t:<18}" + "".join(f" {coverage[(t, k)]:>11}" for k in keys))
    return lines


def _queries(hop_plan: HopPlan, fmt: str) -> list[str]:
    return [t.task for t in hop_plan.tasks] if fmt == "coda" else list(hop_plan.queries)


def _record(row: dict, role: str, demo: tuple[list[int], list[int]], answer: str, searches: list[Search]) -> dict:
    ids, mask = demo
    return {
        "id": row.get("id"),
        "role": role,
        "token_ids": ids,
        "loss_mask": mask,
        "doc_ids": [i for s in searches for i in s.doc_ids],
        "queries": [s.query for s in searches],
        "answer": answer,
    }


def _one_search(tok, row: dict, golds: list[str], docs, fmt: str, style: Style, keep_unsupported: bool) -> list[dict]:
    """The question searched verbatim, its documents, the answer (CoDA: the question delegated whole)."""
    search = Search.of(row["question"], docs)
    # naive RAG shows its passages whole; the search agents see the observation as the rollout cuts it
    shown = search.text if fmt == "rag" else style.observation(tok, "information", search.text)[1]
    supporting = (row.get("metadata") or {}).get("supporting_titles", [])
    if not keep_unsupported and not supported(shown, golds, search.shown_titles(shown), supporting):
        return []
    if fmt == "rag":
        demo = rag_demonstration(tok, row["question"], [(d.title, d.text) for d in docs], golds[0])
        return [_record(row, "policy", demo, golds[0], [search])]
    if fmt != "coda":
        demo = search_demonstration(tok, row["question"], [search], golds[0], style)
        return [_record(row, "policy", demo, golds[0], [search])]
    executor = executor_demonstration(tok, search.query, search, golds[0], style)
    planner = planner_demonstration(tok, row["question"], [(search.query, golds[0])], golds[0], style)
    return [
        _record(row, "executor", executor, golds[0], [search]),
        _record(row, "planner", planner, golds[0], [search]),
    ]


def _two_hops(tok, row: dict, golds: list[str], hop_plan: HopPlan, found: dict, fmt: str, style: Style) -> list[dict]:
    """The two-hop demonstration(s) of a row, or [] when its searches do not show what each hop needs."""
    if fmt == "coda":
        return []  # a plan with sub-questions is built by _delegations; one without delegates the question
    searches = [Search.of(q, found[q]) for q in hop_plan.queries]
    shown = [style.observation(tok, "information", s.text)[1] for s in searches]
    titles = [s.shown_titles(text) for s, text in zip(searches, shown, strict=True)]
    # Each search shows the paragraph it is for (a second search that found nothing new is no hop).
    if not all(set(want) <= set(got) for want, got in zip(hop_plan.targets, titles, strict=True)):
        return []
    supporting = [t for want in hop_plan.targets for t in want]
    if not supported("".join(shown), golds, [t for got in titles for t in got], supporting):
        return []
    demo = search_demonstration(tok, row["question"], searches, golds[0], style)
    return [_record(row, "policy", demo, golds[0], searches)]


def _delegations(tok, row: dict, golds: list[str], hop_plan: HopPlan, found: dict, style: Style) -> list[dict]:
    """CoDA: an executor per sub-question whose documents hold its expected result (that result is its answer),
    then, when every sub-question's did, the planner that delegated them one per turn and answers the question
    with the last executor's answer (a gold answer or an alias of one): the planner learns to pass it on."""
    out, delegations, searches = [], [], []
    for sub in hop_plan.tasks:
        search = Search.of(sub.task, found[sub.task])
        shown = f" {normalize_answer(style.observation(tok, 'documents', search.text)[1])} "
        answer = next((a for a in sub.answers if normalize_answer(a) and f" {normalize_answer(a)} " in shown), None)
        if answer is None:
            continue
        demo = executor_demonstration(tok, sub.task, search, answer, style)
        out.append(_record(row, "executor", demo, answer, [search]))
        delegations.append((sub.task, answer))
        searches.append(search)
    if len(delegations) < len(hop_plan.tasks):
        return out
    last = delegations[-1][1]
    final = last if hop_plan.kind == "bridge" and normalize_answer(last) in map(normalize_answer, golds) else golds[0]
    planner = planner_demonstration(tok, row["question"], delegations, final, style)
    return [*out, _record(row, "planner", planner, final, searches)]


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
    style = Style(args.think, frame, args.max_obs_tokens)
    with RetrieverClient(args.retriever_url) as retriever:
        coverage: Counter = Counter()
        demos = build(rows, tok, retriever, args.topk, args.keep_unsupported, args.format, style, args.hops, coverage)
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
