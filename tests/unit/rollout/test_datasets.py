"""Dataset readers: Search-R1 parquet, FlashRAG JSONL (fixture), bundled sets, GSM8K, synthetic math, splits."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agents.datasets import (
    gold_doc_ids,
    load_prompts,
    read_flashrag_jsonl,
    select_split,
    synthetic_arithmetic,
)

FLASHRAG = Path("/work/shared/data/flashrag-quickstart/nq_test.jsonl")


def test_search_r1_parquet(tmp_path):
    rows = [
        {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": "Answer it. Question: who is x?\n"}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": ["X", "Y"]}},
            "extra_info": {"split": "train", "index": 0},
        },
        {
            "data_source": "hotpotqa",
            "prompt": [{"role": "user", "content": "Question: where?"}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": ["Z"]}},
            "extra_info": {"split": "train", "index": 0},
        },
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    records = load_prompts(str(path))
    assert [r.question for r in records] == ["who is x?", "where?"]
    assert records[0].golden_answers == ["X", "Y"] and records[0].data_source == "nq"
    # Search-R1's per-source index collides across sources; our ids do not
    assert len({r.prompt_id for r in records}) == 2


@pytest.mark.skipif(not FLASHRAG.exists(), reason="shared fixture missing")
def test_flashrag_fixture():
    records = read_flashrag_jsonl(FLASHRAG)
    assert len(records) == 17 and records[0].data_source == "nq" and records[0].split == "test"
    assert records[0].question == "who got the first nobel prize in physics"
    assert records[0].golden_answers == ["Wilhelm Conrad Röntgen"]


def test_bundled_sets_and_gold_docs():
    hotpot = load_prompts("bundled:hotpotqa")
    assert len(hotpot) == 349 and all(gold_doc_ids(r) for r in hotpot)
    lookup = load_prompts("bundled:lookup")
    assert lookup[0].data_source == "lookup" and gold_doc_ids(lookup[0]) == [lookup[0].metadata["gold_doc_id"]]


def test_gsm8k_and_synthetic(tmp_path):
    path = tmp_path / "gsm8k_test.jsonl"
    path.write_text(json.dumps({"question": "2+3?", "answer": "2+3=5\n#### 1,005"}) + "\n")
    (record,) = load_prompts(str(path))
    assert record.golden_answers == ["1005"] and record.split == "test"
    problems = synthetic_arithmetic(20, seed=3)
    assert problems == synthetic_arithmetic(20, seed=3) and len({p.prompt_id for p in problems}) == 20
    for p in problems:
        nums = [int(t) for t in p.question.replace(".", " ").split() if t.isdigit()]
        expected = nums[0] * nums[1] + (nums[2] if "finds" in p.question else -nums[2])
        assert p.golden_answers == [str(expected)]


def test_hashed_split_is_disjoint_and_stable():
    records = synthetic_arithmetic(400)
    train, held = select_split(records, "train", 0.25), select_split(records, "eval", 0.25)
    assert len(train) + len(held) == 400 and not {r.prompt_id for r in train} & {r.prompt_id for r in held}
    assert 60 < len(held) < 140
    assert select_split(records, "eval", 0.25) == held


def test_bad_inputs_say_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_prompts(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"q": 1}\n')
    with pytest.raises(ValueError, match="golden_answers"):
        load_prompts(str(bad))
    with pytest.raises(ValueError, match="unknown bundled"):
        load_prompts("bundled:nope")
