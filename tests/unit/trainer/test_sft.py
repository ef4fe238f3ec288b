"""SFT demonstrations: file reading, the resumable cycle, and make-sft's masking of retrieved text."""

from __future__ import annotations

import json
import re

import pytest

from recipes.core.tokenizer import CharTokenizer
from services.trainer.demonstrations import Style, demonstration
from services.trainer.make_sft import build, supported
from services.trainer.sft import SftData
from shared.protocol.retrieval import RetrievedDocument


def test_sft_data_cycles_from_cursor(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"token_ids": [i, i + 1, i + 2], "loss_mask": [0, 1, 1]} for i in range(3)]
    rows.append({"token_ids": [9, 9], "loss_mask": [0, 0]})  # nothing to imitate: skipped
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = SftData(path)
    assert len(data) == 3
    seqs, cursor = data.take(2, 2)
    assert [s.tokens[0] for s in seqs] == [2, 0] and cursor == 1


def test_sft_data_rejects_misaligned_rows(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"token_ids": [1, 2], "loss_mask": [1]}) + "\n")
    with pytest.raises(ValueError, match="1 mask entries for 2 tokens"):
        SftData(path)


class FakeRetriever:
    """Stands in for the retriever client in this unit test (the integration test uses the real server)."""

    def __init__(self, docs):
        self.docs = docs

    def retrieve(self, queries, topk=None):
        return [self.docs for _ in queries]


def test_documents_are_masked_and_only_policy_text_is_trained():
    tok = CharTokenizer()
    docs = 'Doc 1(Title: "Paris") Paris is the capital of France.\n'
    ids, mask = demonstration(tok, "What is the capital of France?", "Paris", docs)
    trained = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    untrained = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert "capital of France." in untrained and docs in untrained and "<information>" in untrained
    assert "<search> What is the capital of France? </search>" in trained and "<answer> Paris </answer>" in trained
    assert "Doc 1" not in trained and ids[-1] == tok.eos_token_id and mask[-1] == 1


def test_unsupported_questions_are_skipped():
    doc = RetrievedDocument(id="3", contents='"Lyon"\nLyon is a city in France.', score=1.0)
    rows = [
        {"question": "Capital of France?", "golden_answers": ["Paris"]},
        {"question": "Where is Lyon?", "golden_answers": ["France"]},
    ]
    out = build(rows, CharTokenizer(), FakeRetriever([doc]), topk=1)
    assert [r["answer"] for r in out] == ["France"] and out[0]["doc_ids"] == ["3"]
    assert supported("Doc 1(Title: x) yes", ["yes"], ["A"], ["A"]) and not supported("", ["no"], ["A"], ["B"])


def test_coda_format_gives_executor_and_planner_demonstrations():
    tok = CharTokenizer()
    doc = RetrievedDocument(id="7", contents='"Paris"\nParis is a city. It is the capital of France.', score=1.0)
    rows = [{"question": "What is the capital of France?", "golden_answers": ["Paris"]}]
    out = build(rows, tok, FakeRetriever([doc]), topk=1, fmt="coda")
    assert [r["role"] for r in out] == ["executor", "planner"]
    for r in out:
        trained = tok.decode([t for t, m in zip(r["token_ids"], r["loss_mask"], strict=True) if m])
        untrained = tok.decode([t for t, m in zip(r["token_ids"], r["loss_mask"], strict=True) if not m])
        assert "<answer> Paris </answer>" in trained
        if r["role"] == "executor":
            assert "<documents>" in untrained and "<search>" in trained
            assert "<refine> Paris is a city. </refine>" in trained  # a sentence copied from the real document
        else:
            assert "<task> What is the capital of France? </task>" in trained
            assert "<result>Paris</result>" in untrained and "<documents>" not in untrained


@pytest.mark.parametrize("fmt", ["search", "coda"])
def test_no_think_leaves_the_fixed_thoughts_out_and_nothing_else(fmt):
    tok = CharTokenizer()
    doc = RetrievedDocument(id="7", contents='"Paris"\nParis is the capital of France.', score=1.0)
    rows = [{"question": "What is the capital of France?", "golden_answers": ["Paris"]}]
    with_think = build(rows, tok, FakeRetriever([doc]), topk=1, fmt=fmt)
    without = build(rows, tok, FakeRetriever([doc]), topk=1, fmt=fmt, style=Style(think=False))
    for a, b in zip(with_think, without, strict=True):
        text_a, text_b = tok.decode(a["token_ids"]), tok.decode(b["token_ids"])
        assert re.sub(r"<think> [^<]*</think>\n", "", text_a) == text_b  # (the prompts name the tag too)
        trained_a = tok.decode([t for t, m in zip(a["token_ids"], a["loss_mask"], strict=True) if m])
        trained_b = tok.decode([t for t, m in zip(b["token_ids"], b["loss_mask"], strict=True) if m])
        assert "<think>" in trained_a and "<think>" not in trained_b
        assert trained_b.startswith(("<search>", "<task>"))
