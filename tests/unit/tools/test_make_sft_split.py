"""make-sft's ``--split``: demonstrations come from the same hashed train half the rollout trains on, so none
answers a question the held-out eval asks."""

from __future__ import annotations

from agents.datasets import load_prompts, select_split
from tools.make_sft import qa_rows


def test_the_train_split_leaves_out_every_question_eval_asks():
    train = {r["question"] for r in qa_rows("bundled:hotpotqa", "train")}
    held_out = {r.question for r in select_split(load_prompts("bundled:hotpotqa"), "eval")}
    assert held_out and train and not train & held_out
    assert len(train) + len(held_out) == len(load_prompts("bundled:hotpotqa"))


def test_rows_keep_what_the_demonstrations_read(tmp_path):
    row = qa_rows("bundled:hotpotqa", "train")[0]
    assert row["question"] and row["golden_answers"] and "supporting_titles" in row["metadata"]
    path = tmp_path / "qa.jsonl"
    path.write_text('{"id": "a", "question": "Who?", "golden_answers": ["x"]}\n')
    assert qa_rows(str(path)) == [{"id": "a", "question": "Who?", "golden_answers": ["x"]}]
