"""SFT demonstrations: file reading, the seeded role-balanced order and its resumable cursor, the count of split
planner demonstrations a warm start shows, and make-sft's masking of retrieved text."""

from __future__ import annotations

import json
import re

import pytest

from agents.core.demonstrations import Style, supported
from agents.prompts import CharTokenizer
from agents.search_r1 import demonstration
from services.trainer.sft import SftData
from shared.protocol.retrieval import RetrievedDocument
from tools.make_sft import build


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _demo(tok, qid=None, role="policy", queries=1):
    """A one-trained-token demonstration whose first token ``tok`` names it."""
    return {"id": qid, "role": role, "token_ids": [tok, 0], "loss_mask": [1, 0], "queries": ["q"] * queries}


def _firsts(seqs):
    return [s.tokens[0] for s in seqs]


def _coda_file(path):
    """6 questions, each 3 executor rows (tokens 10q, 10q+1, 10q+2) and a planner row (10q+9), the questions'
    rows interleaved in the file so that a question's rows are together only if the reader groups them."""
    rows = [_demo(10 * q + e, f"q{q}", "executor") for e in range(3) for q in range(6)]
    rows += [_demo(10 * q + 9, f"q{q}", "planner") for q in range(6)]
    return _write(path, rows)


def test_the_cursor_counts_demonstrations_and_rows_without_trained_tokens_are_skipped(tmp_path):
    rows = [{"token_ids": [i, i + 1, i + 2], "loss_mask": [0, 1, 1]} for i in range(3)]
    rows.append({"token_ids": [9, 9], "loss_mask": [0, 0]})  # nothing to imitate: skipped
    data = SftData(_write(tmp_path / "d.jsonl", rows))
    assert len(data) == 3
    seqs, cursor = data.take(2, 2)
    assert cursor == 4 and [s.index for s in seqs] == [0, 1]
    assert all(s.tokens[0] in (0, 1, 2) and s.mask == [0, 1, 1] for s in seqs)


def test_the_order_is_fixed_by_the_seed_and_each_epoch_shows_every_row_once(tmp_path):
    path = _write(tmp_path / "d.jsonl", [_demo(i) for i in range(20)])  # the flat agent's: no id, one role
    order = _firsts(SftData(path, seed=3).take(0, 40)[0])
    assert order == _firsts(SftData(path, seed=3).take(0, 40)[0])
    assert order != _firsts(SftData(path, seed=4).take(0, 40)[0])
    assert sorted(order[:20]) == sorted(order[20:]) == list(range(20))  # each row once per epoch
    assert order[:20] != order[20:] and order[:20] != list(range(20))  # a fresh permutation, not file order


def test_a_resumed_cursor_continues_exactly(tmp_path):
    path = _coda_file(tmp_path / "d.jsonl")
    first, cursor = SftData(path, seed=1).take(0, 4)
    second, end = SftData(path, seed=1).take(cursor, 4)  # a new reader, as after a restart
    whole, whole_end = SftData(path, seed=1).take(0, 8)
    assert (cursor, end, whole_end) == (4, 8, 8)
    assert _firsts(first + second) == _firsts(whole)
    late = SftData(path, seed=1)
    assert _firsts(late.take(100, 6)[0]) == _firsts(SftData(path, seed=1).take(0, 106)[0])[100:]


def _runs(tokens):
    """Question of each token (its tens), collapsed to runs: a question's rows together give one run each."""
    runs = []
    for t in tokens:
        if not runs or runs[-1] != t // 10:
            runs.append(t // 10)
    return runs


def test_without_balance_a_questions_rows_are_together_and_each_shown_once_an_epoch(tmp_path):
    data = SftData(_coda_file(tmp_path / "d.jsonl"), seed=0, planner_share=0)
    epoch = _firsts(data.take(0, 24)[0])
    assert sorted(epoch) == sorted(10 * q + e for q in range(6) for e in (0, 1, 2, 9))
    assert sorted(_runs(epoch)) == list(range(6))  # 6 runs, one per question
    assert sorted(_firsts(data.take(24, 24)[0])) == sorted(epoch)


def test_a_repeated_demonstration_is_a_group_of_its_own(tmp_path):
    # q0's planner written three times (copy 1 and 2 are make-sft's up-weighting): without the copy number the
    # three would be one group, shown back to back in the same batch.
    rows = [_demo(10 * q + 9, f"q{q}", "planner") for q in range(4)]
    rows += [{**_demo(9, "q0", "planner"), "copy": k} for k in (1, 2)]
    data = SftData(_write(tmp_path / "d.jsonl", rows), seed=0, planner_share=0)
    assert sorted(len(g) for g in data.everything.groups) == [1] * 6
    epoch = _firsts(data.take(0, 6)[0])
    assert sorted(epoch) == [9, 9, 9, 19, 29, 39]


def test_planner_rows_fill_half_of_every_batch_and_repeat(tmp_path):
    data = SftData(_coda_file(tmp_path / "d.jsonl"), seed=0)
    planner = [t % 10 == 9 for t in _firsts(data.take(0, 8)[0])]
    assert planner == [False, True] * 4  # the planner slots alternate
    for cursor in range(0, 30):
        assert sum(t % 10 == 9 for t in _firsts(data.take(cursor, 4)[0])) == 2
    shown = _firsts(data.take(0, 36)[0])
    planners, executors = shown[1::2], shown[0::2]
    # 18 planner slots over 6 planner rows: each shown 3 times, one epoch of its stream every 6 slots
    assert [sorted(planners[i : i + 6]) for i in (0, 6, 12)] == [[9, 19, 29, 39, 49, 59]] * 3
    # 18 executor slots: each executor row once, a question's 3 rows together
    assert sorted(executors) == sorted(10 * q + e for q in range(6) for e in range(3))
    assert sorted(_runs(executors)) == list(range(6))


def test_a_file_of_one_role_is_one_shuffled_stream(tmp_path):
    rows = [_demo(10 * q + e, f"q{q}", "policy", queries=2) for q in range(3) for e in range(2)]
    data = SftData(_write(tmp_path / "d.jsonl", rows), seed=0)
    epoch = _firsts(data.take(0, 6)[0])
    assert sorted(epoch) == [0, 1, 10, 11, 20, 21] and sorted(_runs(epoch)) == [0, 1, 2]
    assert data.steps_to_see_split(1, 4) is None  # two queries, but not a planner's: no split demonstration
    assert data.split_planner_rows_seen(10, 4) == 0


def _split_file(path):
    """Two questions: q0 split (2 executors, a planner delegating 2 sub-questions), q1 not (1 and 1)."""
    rows = [_demo(0, "q0", "executor"), _demo(1, "q0", "executor"), _demo(9, "q0", "planner", queries=2)]
    rows += [_demo(10, "q1", "executor"), _demo(19, "q1", "planner", queries=1)]
    return _write(path, rows)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_split_planner_demonstrations_seen_are_counted_with_repeats(tmp_path, seed):
    data = SftData(_split_file(tmp_path / "d.jsonl"), seed=seed)
    # A batch of 4 has 2 planner slots, one whole epoch of the 2 planner rows: exactly 1 split row per step.
    assert [data.split_planner_rows_seen(s, 4) for s in range(5)] == [0, 1, 2, 3, 4]
    assert data.steps_to_see_split(40, 4) == 40 and data.steps_to_see_split(0, 4) == 0
    # A batch of 2 has 1 planner slot: 2k steps show k split rows, and the fewest steps are the first that do.
    need = data.steps_to_see_split(5, 2)
    assert need in (9, 10)
    assert data.split_planner_rows_seen(need, 2) == 5 and data.split_planner_rows_seen(need - 1, 2) == 4


def test_start_up_logs_the_steps_to_see_40_split_planner_demonstrations(tmp_path, caplog):
    caplog.set_level("INFO", logger="services.trainer.sft")
    SftData(_split_file(tmp_path / "d.jsonl")).log_coverage(4, steps=10)
    (record,) = caplog.records
    assert record.steps_to_see_40_split == 40 and record.split_planner_seen == 10
    assert (record.demonstrations, record.planner, record.split_planner) == (5, 2, 1)
    caplog.clear()
    SftData(_write(tmp_path / "flat.jsonl", [_demo(1), _demo(2)])).log_coverage(4, steps=10)
    assert not caplog.records  # the flat agent's file has no planner rows: nothing to say


def test_planner_share_must_be_a_fraction(tmp_path):
    with pytest.raises(ValueError, match="planner_share"):
        SftData(_split_file(tmp_path / "d.jsonl"), planner_share=1.5)


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
