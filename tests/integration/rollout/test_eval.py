"""``eval``: greedy episodes over a split, EM/F1 per data source, a table and a JSON file."""

from __future__ import annotations

import json

from services.rollout.eval import format_table, run_eval


def test_eval_writes_table_and_json(fake_llm, make_settings, tmp_path, capsys):
    settings = make_settings(fake_llm.url, agent="search-r1", split="test", dataset="bundled:lookup-test",
                             eval_limit=6, eval_output=str(tmp_path))
    path = run_eval(settings)
    result = json.loads(path.read_text())
    assert result["by_source"]["lookup"]["n"] == 6 and result["failed"] == 0
    assert set(result["metrics"]) >= {"em", "f1"} and len(result["rows"]) == 6
    assert all(c.prompt_text and c.stop == ["</search>", "</answer>"] for c in fake_llm.calls)
    body = fake_llm.calls[0]
    assert body.model == "policy"
    out = capsys.readouterr().out
    assert "| lookup | 6 |" in out and "| ALL | 6 |" in out and format_table(result) in out
