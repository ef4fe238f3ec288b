"""``eval``: greedy episodes over a split, EM/F1 per data source, a table and a JSON file."""

from __future__ import annotations

import json

from services.rollout.__main__ import main
from services.rollout.eval import format_table, run_eval


def test_eval_writes_table_and_json(fake_llm, make_settings, tmp_path):
    settings = make_settings(
        fake_llm.url,
        agent="search-r1",
        split="test",
        dataset="bundled:lookup-test",
        eval_limit=6,
        eval_output=str(tmp_path),
    )
    path, returned = run_eval(settings)
    result = json.loads(path.read_text())
    assert result == json.loads(json.dumps(returned))
    assert result["by_source"]["lookup"]["n"] == 6 and result["failed"] == 0
    assert set(result["metrics"]) >= {"em", "f1"} and len(result["rows"]) == 6
    assert all(c.prompt_text and c.stop == ["</search>", "</answer>"] for c in fake_llm.calls)
    body = fake_llm.calls[0]
    assert body.model == "policy"
    table = format_table(result)
    assert "| lookup | 6 |" in table and "| ALL | 6 |" in table


def test_eval_command_prints_the_table(fake_llm, make_settings, tmp_path, capsys):
    """``python -m services.rollout eval`` prints the table and where the JSON went (the CLI's stdout)."""
    settings = make_settings(fake_llm.url)
    main(
        [
            "eval",
            "--agent",
            "search-r1",
            "--split",
            "test",
            "--dataset",
            "bundled:lookup-test",
            "--eval-limit",
            "4",
            "--eval-output",
            str(tmp_path),
            "--tokenizer",
            "char",
            "--inference-url",
            fake_llm.url,
            "--retriever-url",
            settings.retriever_url,
            "--redis-url",
            settings.redis_url,
        ]
    )
    out = capsys.readouterr().out
    written = list(tmp_path.glob("search-r1-test-*.json"))
    assert len(written) == 1
    assert format_table(json.loads(written[0].read_text())) in out
    assert "| lookup | 4 |" in out and "4 prompts, 0 failed" in out and str(written[0]) in out


def test_eval_evaluates_the_adapter_the_trainer_published(fake_llm, make_settings, redis_client, tmp_path):
    """A LoRA run's trained policy is an adapter: the eval finds it on the weights stream instead of
    evaluating the untouched base model (which made a trained LoRA run look like it learned nothing)."""
    from shared.stream import encode
    from tests.factories import make_weight_update

    fake_llm.loras["policy-v3"] = "/weights/v3"
    redis_client.xadd("weights", encode(make_weight_update(3)))
    settings = make_settings(
        fake_llm.url,
        agent="search-r1",
        split="test",
        dataset="bundled:lookup-test",
        eval_limit=3,
        eval_output=str(tmp_path),
    )
    _, result = run_eval(settings)
    assert result["model"] == "policy-v3" and result["failed"] == 0
    assert {c.model for c in fake_llm.calls} == {"policy-v3"}
    _, base = run_eval(settings.model_copy(update={"eval_policy": "base"}))
    assert base["model"] == "policy"
