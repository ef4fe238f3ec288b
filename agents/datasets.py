"""Prompt datasets the rollout and eval read, as ``PromptRecord`` rows.

Formats:
- Search-R1 parquet: ``data_source, prompt=[{role, content}], reward_model.ground_truth.target,
  extra_info={split, index}``. The question is taken from a ``question`` column when present, else from the
  user message after its last ``Question:``. The prompt id is ``data_source/split/index``: Search-R1's
  ``index`` counts per source, so the source must be part of the id or merged sets collide.
- FlashRAG JSONL: ``{id, question, golden_answers, metadata?}`` (``<source>/<split>.jsonl`` or
  ``<source>_<split>.jsonl``).
- GSM8K JSONL: ``{question, answer}`` with the target after ``####`` (math word problems).
- ``bundled:hotpotqa-dev`` / ``bundled:2wiki-dev``: real multi-hop dev questions (``data/hotpotqa-dev``,
  ``data/2wiki-dev``) with a **fixed split**: every question is ``train`` or ``heldout`` by a hash of its own id
  (``FIXED_SPLITS``), whatever a recipe's ``eval_fraction`` says, so that no recipe can train on or demonstrate
  a question the benchmark reports.
- ``bundled:hotpotqa``: the small legacy set ``data/hotpotqa/qa_supported.jsonl`` (6.8k-paragraph corpus). Its
  100 questions from AMOR's ``dev.json`` are not HotpotQA dev questions: they load under the data source
  ``hotpotqa-nondev``, so no table reports them as dev results. ``bundled:lookup`` / ``bundled:lookup-test``:
  the synthetic lookup world of the embedded default (``data/lookup``).
- Any JSONL with ``prompt_field`` named (``[rollout] prompt_field``): that field is the prompt, ``gold_field``
  (optional) the gold answer(s); the whole row is kept as the record's metadata, for user rewards.
- ``synthetic:arithmetic[:N]``: generated two-step word problems with exact answers (recursive reasoner
  smoke runs and tests; nothing to download).

``select_split`` carves a deterministic held-out split out of a single file by hashing prompt ids (or takes the
fixed split of a dataset that has one).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.answers import gsm8k_target

REPO_ROOT = Path(__file__).resolve().parent.parent
BUNDLED = {
    "hotpotqa": REPO_ROOT / "data" / "hotpotqa" / "qa_supported.jsonl",
    "hotpotqa-dev": REPO_ROOT / "data" / "hotpotqa-dev" / "qa.jsonl",
    "2wiki-dev": REPO_ROOT / "data" / "2wiki-dev" / "qa.jsonl",
    "lookup": REPO_ROOT / "data" / "lookup" / "train.jsonl",
    "lookup-test": REPO_ROOT / "data" / "lookup" / "test.jsonl",
}
SPLIT_NAMES = {"train", "dev", "val", "valid", "validation", "test"}
# The bundled real benchmarks: the share of questions held out, by the hash of the dataset's own question id.
# Chosen so that each held-out split has >= 300 questions (HotpotQA: 312 of 615 held out, 303 to train on;
# 2Wiki: 306 of 1,305, 999 to train on); changing a fraction moves questions between train and held-out, so it never changes silently
# (tests/unit/rollout/test_benchmark_splits.py pins the counts).
FIXED_SPLITS = {"hotpotqa-dev": 0.50, "2wiki-dev": 0.25}
HELDOUT = "heldout"
NON_DEV_SOURCE = "amor_dev_distractor"  # legacy qa_supported.jsonl rows that are not HotpotQA dev questions


@dataclass(frozen=True)
class PromptRecord:
    prompt_id: str  # unique across sources
    question: str
    golden_answers: list[str]
    data_source: str = ""
    split: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- readers
def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open() as fh:
        for n, line in enumerate(fh, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not JSON: {exc}") from exc
    return rows


def _source_and_split(path: Path) -> tuple[str, str]:
    """``nq/test.jsonl`` → (nq, test); ``nq_test.jsonl`` → (nq, test); ``foo.jsonl`` → (foo, "")."""
    if path.stem in SPLIT_NAMES:
        return path.parent.name, path.stem
    head, _, tail = path.stem.rpartition("_")
    return (head, tail) if head and tail in SPLIT_NAMES else (path.stem, "")


def read_flashrag_jsonl(path: str | Path, data_source: str | None = None) -> list[PromptRecord]:
    path = Path(path)
    source, split = _source_and_split(path)
    source = data_source or source
    out = []
    for i, row in enumerate(_read_jsonl(path)):
        if "question" not in row or "golden_answers" not in row:
            raise ValueError(f"{path} row {i}: FlashRAG rows need 'question' and 'golden_answers'")
        out.append(_flashrag_record(row, source, split, row.get("id", i)))
    return out


def _flashrag_record(row: dict[str, Any], source: str, split: str, row_id: object) -> PromptRecord:
    golds = row["golden_answers"]
    return PromptRecord(
        prompt_id=f"{source}/{split or 'all'}/{row_id}",
        question=str(row["question"]),
        golden_answers=[golds] if isinstance(golds, str) else [str(g) for g in golds],
        data_source=source,
        split=split,
        metadata=row.get("metadata") or {},
    )


def read_prompt_jsonl(path: str | Path, prompt_field: str, gold_field: str | None = None) -> list[PromptRecord]:
    """Rows of any JSONL whose ``prompt_field`` holds the prompt (a string); ``gold_field``: the gold answer
    or list of answers, when the rows have one. The row, whole, is the record's metadata."""
    path = Path(path)
    source, split = _source_and_split(path)
    out = []
    for i, row in enumerate(_read_jsonl(path)):
        if not isinstance(row, dict) or not isinstance(row.get(prompt_field), str):
            raise ValueError(f"{path} row {i}: no string field {prompt_field!r} (prompt_field)")
        golds = row.get(gold_field) if gold_field else None
        if gold_field and golds is None:
            raise ValueError(f"{path} row {i}: no field {gold_field!r} (gold_field)")
        golds = [] if golds is None else [str(golds)] if not isinstance(golds, list) else [str(g) for g in golds]
        out.append(
            PromptRecord(
                prompt_id=f"{source}/{split or 'all'}/{row.get('id', i)}",
                question=row[prompt_field],
                golden_answers=golds,
                data_source=source,
                split=split,
                metadata=row,
            )
        )
    return out


def gold_doc_ids(record: PromptRecord) -> list[str]:
    """Corpus ids of the documents that answer a record (HotpotQA ``supporting_doc_ids``, lookup
    ``gold_doc_id``); empty when the dataset does not say."""
    meta = record.metadata
    ids = meta.get("supporting_doc_ids") or ([meta["gold_doc_id"]] if meta.get("gold_doc_id") else [])
    return [str(i) for i in ids if i is not None]


def read_gsm8k_jsonl(path: str | Path, data_source: str = "gsm8k") -> list[PromptRecord]:
    path = Path(path)
    _, split = _source_and_split(path)
    out = []
    for i, row in enumerate(_read_jsonl(path)):
        target = gsm8k_target(str(row["answer"]))
        if target is None:
            raise ValueError(f"{path} row {i}: no numeric answer in {row['answer']!r}")
        out.append(
            PromptRecord(
                prompt_id=f"{data_source}/{split or 'all'}/{row.get('id', i)}",
                question=str(row["question"]),
                golden_answers=[_number_text(target)],
                data_source=data_source,
                split=split,
            )
        )
    return out


def _number_text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _question_from_prompt(prompt: Any) -> str:
    messages = list(prompt) if not isinstance(prompt, str) else [{"role": "user", "content": prompt}]
    user = [m["content"] for m in messages if m.get("role") == "user"]
    text = user[-1] if user else str(prompt)
    _head, sep, tail = text.rpartition("Question:")
    return (tail if sep else text).strip()


def read_search_r1_parquet(path: str | Path) -> list[PromptRecord]:
    import pyarrow.parquet as pq  # rollout extra

    path = Path(path)
    out = []
    for i, row in enumerate(pq.read_table(path).to_pylist()):
        target = ((row.get("reward_model") or {}).get("ground_truth") or {}).get("target")
        if target is None:
            raise ValueError(f"{path} row {i}: no reward_model.ground_truth.target")
        extra = row.get("extra_info") or {}
        source = str(row.get("data_source") or path.stem)
        split = str(extra.get("split") or "")
        question = row.get("question") or _question_from_prompt(row.get("prompt") or "")
        out.append(
            PromptRecord(
                prompt_id=f"{source}/{split or 'all'}/{extra.get('index', i)}",
                question=str(question),
                golden_answers=[target] if isinstance(target, str) else [str(t) for t in target],
                data_source=source,
                split=split,
                metadata={"extra_info": extra},
            )
        )
    return out


# ---------------------------------------------------------------- synthetic math
_ITEMS = ["apples", "books", "marbles", "stamps", "pencils", "shells"]
_NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana"]


def synthetic_arithmetic(n: int, seed: int = 0) -> list[PromptRecord]:
    """``n`` two-step word problems (multiply, then add or subtract) with exact integer answers."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        boxes, per_box, extra = rng.randint(2, 9), rng.randint(2, 12), rng.randint(1, 20)
        if rng.random() < 0.5:
            q = (
                f"{name} has {boxes} boxes with {per_box} {item} in each box and finds {extra} more {item}. "
                f"How many {item} does {name} have now?"
            )
            answer = boxes * per_box + extra
        else:
            extra = min(extra, boxes * per_box)
            q = (
                f"{name} has {boxes} boxes with {per_box} {item} in each box and gives away {extra} {item}. "
                f"How many {item} does {name} have left?"
            )
            answer = boxes * per_box - extra
        out.append(
            PromptRecord(
                prompt_id=f"arithmetic/{seed}/{i}", question=q, golden_answers=[str(answer)], data_source="arithmetic"
            )
        )
    return out


# ---------------------------------------------------------------- dispatch and splits
def load_prompts(source: str, prompt_field: str | None = None, gold_field: str | None = None) -> list[PromptRecord]:
    """Records from a path (``.parquet``, ``.jsonl``), ``bundled:<name>`` or ``synthetic:arithmetic[:N]``;
    with ``prompt_field``, from any JSONL (``read_prompt_jsonl``)."""
    if prompt_field:
        if not Path(source).is_file():
            raise FileNotFoundError(
                f"dataset not found: {source} (a prompt field is named, so it must be a JSONL file; "
                "bundled: and synthetic: datasets are loaded by name, without one)"
            )
        return read_prompt_jsonl(source, prompt_field, gold_field)
    if source.startswith("bundled:"):
        return load_bundled(source.split(":", 1)[1])
    if source.startswith("synthetic:"):
        parts = source.split(":")
        if parts[1] != "arithmetic":
            raise ValueError(f"unknown synthetic dataset {parts[1]!r}; known: arithmetic")
        return synthetic_arithmetic(int(parts[2]) if len(parts) > 2 else 200)
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"dataset not found: {source}")
    if path.suffix == ".parquet":
        return read_search_r1_parquet(path)
    if path.suffix in (".jsonl", ".json"):
        first = next((json.loads(line) for line in path.open() if line.strip()), {})
        if "golden_answers" in first:
            return read_flashrag_jsonl(path)
        if "answer" in first:
            return read_gsm8k_jsonl(path)
        raise ValueError(f"{path}: rows have neither 'golden_answers' (FlashRAG) nor 'answer' (GSM8K)")
    raise ValueError(f"{path}: unsupported dataset file type {path.suffix!r} (want .parquet or .jsonl)")


def load_bundled(name: str) -> list[PromptRecord]:
    if name not in BUNDLED:
        raise ValueError(f"unknown bundled dataset {name!r}; known: {sorted(BUNDLED)}")
    if name in FIXED_SPLITS:
        from agents.gold_paragraphs import with_paragraph_evidences  # here: that module imports this one

        records = [_fixed_split(row, name, FIXED_SPLITS[name]) for row in _read_jsonl(BUNDLED[name])]
        return with_paragraph_evidences(records, name)
    records = read_flashrag_jsonl(BUNDLED[name], data_source=name.split("-")[0])
    if name == "hotpotqa":
        records = [
            dataclasses.replace(r, data_source="hotpotqa-nondev") if r.metadata.get("source") == NON_DEV_SOURCE else r
            for r in records
        ]
    return records


def _fixed_split(row: dict[str, Any], name: str, fraction: float) -> PromptRecord:
    qid = str(row["id"])
    return _flashrag_record(row, name, HELDOUT if held_out(qid, fraction) else "train", qid)


def question_type(record: PromptRecord) -> str:
    """A multi-hop question's type (bridge, comparison, compositional, ...): the source's label; for a 2Wiki
    question whose source dropped it (558 of 1,305), the type its shape gives (``wiki_type_from_shape``, which
    agrees with every one of the 747 labels there is); ``unknown`` otherwise."""
    meta = record.metadata
    if meta.get("type"):
        return str(meta["type"])
    if meta.get("dataset") == "2wikimultihopqa" and meta.get("supporting_titles"):
        return wiki_type_from_shape(record.question, len(meta["supporting_titles"]))
    return "unknown"


_RELATIVE = (
    r"(paternal |maternal )?(grand)?"
    r"(father|mother|son|daughter|child|husband|wife|uncle|aunt|sibling|brother|sister|stepmother|stepfather)"
    r"(-in-law)?"
)
# "Who is X's mother-in-law?" / "Who is the paternal grandfather of X?", but not "Who is the father of the
# director of film X?" (a relation of a relation's holder: compositional).
_INFERENCE = re.compile(rf"^who is (.+'s? {_RELATIVE}\??$|the {_RELATIVE} of (?!the \w+ of ))", re.IGNORECASE)
_COMPARISON = re.compile(r"\b(or|same|both|out of)\b", re.IGNORECASE)


def wiki_type_from_shape(question: str, supporting_titles: int) -> str:
    """2WikiMultihopQA's question type from the question's wording and its number of supporting paragraphs:
    four paragraphs → bridge_comparison (two entities, each through a relation); a kinship question →
    inference; two entities set against each other → comparison; else compositional. It agrees with the
    source's label on all 747 labelled dev questions (``tests/unit/rollout/test_benchmark_splits.py``)."""
    if supporting_titles >= 4:
        return "bridge_comparison"
    if _INFERENCE.match(question.strip()):
        return "inference"
    return "comparison" if _COMPARISON.search(question) else "compositional"


def held_out(prompt_id: str, fraction: float) -> bool:
    """Deterministic membership of the held-out split (stable across runs and machines)."""
    digest = hashlib.sha256(prompt_id.encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < fraction


def select_split(records: list[PromptRecord], split: str, eval_fraction: float = 0.1) -> list[PromptRecord]:
    """``train``/``eval`` halves of one file by hashed prompt id (a dataset with a fixed split, every record
    ``train`` or ``heldout``, keeps its own: ``eval`` is its ``heldout``, whatever ``eval_fraction`` says);
    ``all`` keeps everything; any other name keeps the rows whose own ``split`` field equals it."""
    if split == "all":
        return list(records)
    if records and split in ("train", "eval", HELDOUT) and all(r.split in ("train", HELDOUT) for r in records):
        want = "train" if split == "train" else HELDOUT
        return [r for r in records if r.split == want]
    if split in ("train", "eval"):
        want_eval = split == "eval"
        return [r for r in records if held_out(r.prompt_id, eval_fraction) == want_eval]
    return [r for r in records if r.split == split]
