"""``eval``: greedy episodes over a split, EM/F1 per data source, a table and a JSON file."""

from __future__ import annotations

import json

import pytest

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
    evaluating the untouched base model (which made a trained LoRA run look like it learned nothing), and
    loads it into the server first when no rollout did (the trainer loads nothing)."""
    from shared.stream import encode
    from tests.factories import make_weight_update

    assert "policy-v3" not in fake_llm.loras
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
    assert fake_llm.loras["policy-v3"] == "/weights/v3"  # the eval's weight sync loaded it
    assert {c.model for c in fake_llm.calls} == {"policy-v3"}
    _, base = run_eval(settings.model_copy(update={"eval_policy": "base"}))
    assert base["model"] == "policy"


REWARD = """
def question_length(completion, gold, row):
    if row["id"].endswith("-job"):
        raise RuntimeError("this reward fails on the questions about jobs")
    return {"reward": len(row["question"]) / 100, "words": float(len(completion.split()))}
"""


def test_eval_scores_each_row_with_the_recipes_reward(fake_llm, make_settings, tmp_path, monkeypatch):
    """A reward of the user's own that has nothing to do with gold answers: each eval row carries it (the
    function the rollout trains on, loaded by the same name), and the table and summary its mean; a row whose
    reward fails is a scored miss with its error, its answer still scored."""
    (tmp_path / "eval_reward_probe.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    settings = make_settings(
        fake_llm.url,
        agent="search-r1",
        reward="eval_reward_probe:question_length",
        split="test",
        dataset="bundled:lookup-test",
        eval_limit=6,
        eval_output=str(tmp_path / "out"),
        eval_policy="base",  # the session's Redis may hold another test's published adapter
    )
    _, result = run_eval(settings)
    rows = {r["prompt_id"]: r for r in result["rows"]}
    failed = [pid for pid in rows if pid.endswith("-job")]
    assert 0 < len(failed) < 6 and result["failed"] == len(failed)
    for pid, row in rows.items():
        if pid in failed:
            assert row["reward"] == 0.0 and "this reward fails" in row["error"]
            assert row["prediction"] is not None and "em" in row
        else:
            assert row["reward"] == len(row["question"]) / 100 > 0 and row["error"] is None
    assert "reward" in result["metrics"]
    assert result["by_source"]["ALL"]["reward"] == pytest.approx(sum(r["reward"] for r in rows.values()) / 6)
    assert f"| {result['by_source']['ALL']['reward']:.3f} |" in format_table(result)  # as it is, not in percent

    from launcher.report import read_eval, render_summary

    after = read_eval(tmp_path / "out")
    assert after.metrics["reward"] == result["by_source"]["ALL"]["reward"]
    summary = render_summary(tmp_path, after, after, 60)
    mean = f"{after.metrics['reward']:.3f}"
    assert f"| reward (the recipe's, greedy) | {mean} | {mean} |" in summary


def test_eval_rows_carry_the_agents_own_reward_by_default(fake_llm, make_settings, tmp_path):
    """Without ``[rollout] reward`` the column is the agent's own: CoDA's planner reward (``6·F1 − 3``, its fact
    credit, its restating penalty and format term), negative where the answer is wrong (the fake's answers are),
    not the answer's EM."""
    settings = make_settings(
        fake_llm.url,
        agent="coda",
        split="test",
        dataset="bundled:lookup-test",
        eval_limit=4,
        eval_output=str(tmp_path),
        eval_policy="base",
    )
    _, result = run_eval(settings)
    assert "reward" in result["metrics"] and result["failed"] == 0
    rows = result["rows"]
    # The fake's planner delegates the question itself: −3 for the answer, −1 for the restated task, +0.1 format.
    assert all(r["f1"] == 0.0 and -4.0 <= r["reward"] < 0.0 for r in rows), [(r["f1"], r["reward"]) for r in rows]
    # Each row keeps the agent's own record: CoDA's delegated tasks beside what each executor answered.
    for row in rows:
        assert set(row["facts"]) == {"tasks", "executor_answers", "executed"}, row["facts"]
        assert len(row["facts"]["tasks"]) == len(row["facts"]["executor_answers"]) == len(row["facts"]["executed"])
    written = json.loads(next(tmp_path.glob("**/*.json")).read_text())["rows"]
    assert [r["facts"] for r in written] == [r["facts"] for r in sorted(rows, key=lambda r: r["prompt_id"])]
    # ... and how each of its trajectories ended: the planner first, then one executor per task that ran one (a task
    # asked again is answered from the episode's earlier answer).
    for row in rows:
        roles = [t["role"] for t in row["trajectories"]]
        assert roles == ["planner"] + ["executor"] * sum(row["facts"]["executed"]), roles
        assert all(t["finish"] and t["turns"] >= 1 for t in row["trajectories"]), row["trajectories"]
