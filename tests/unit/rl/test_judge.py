"""LLM judge: score parsing, bounded retries and the never-raise fallbacks.

The judge is an OpenAI-compatible server that cannot run in unit tests; ``httpx.MockTransport`` answers in the
``/v1/chat/completions`` response shape (``choices[0].message.content``) so the real client code runs.
"""

import httpx
import pytest

from shared.retry import RetryPolicy
from shared.rewards.judge import JudgeConfig, JudgeStats, judge_messages, judge_score, parse_judge_score

CFG = JudgeConfig(base_url="http://judge.test/v1", model="judge", retry=RetryPolicy(attempts=3, backoff_s=0.0))


def chat(content):
    return {"id": "x", "object": "chat.completion", "model": "judge",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]}


def client_for(*responses):
    calls = []

    def handler(request):
        calls.append(request)
        item = responses[min(len(calls), len(responses)) - 1]
        if isinstance(item, Exception):
            raise item
        return item

    return httpx.AsyncClient(transport=httpx.MockTransport(handler)), calls


def test_parse_judge_score():
    assert parse_judge_score("good. [[Score: 7]]") == 0.7
    assert parse_judge_score("[[Score: 3]] then [[ score: 8.5 ]]") == 0.85
    assert parse_judge_score("[[Score: 12]]") == 1.0
    assert parse_judge_score("Score: 7") is None
    assert parse_judge_score("") is None


def test_judge_messages_include_question_golds_answer():
    msgs = judge_messages("Who?", ["Ann", "Anne"], "Ann")
    assert msgs[0]["role"] == "system" and "[[Score: X]]" in msgs[0]["content"]
    assert "Who?" in msgs[1]["content"] and "- Anne" in msgs[1]["content"]


async def test_judge_success_sends_openai_body():
    client, calls = client_for(httpx.Response(200, json=chat("fine [[Score: 9]]")))
    r = await judge_score(client, CFG, "q", ["a"], "a")
    assert r.reward == pytest.approx(0.9) and r.components["judge_error"] == 0.0
    body = calls[0].read().decode()
    assert calls[0].url.path == "/v1/chat/completions" and '"model":"judge"' in body.replace(" ", "")


async def test_judge_retries_5xx_then_succeeds():
    client, calls = client_for(httpx.Response(503), httpx.Response(200, json=chat("[[Score: 5]]")))
    stats = JudgeStats()
    r = await judge_score(client, CFG, "q", ["a"], "b", stats)
    assert r.reward == 0.5 and len(calls) == 2 and stats.errors == 0


async def test_judge_error_falls_back_and_counts():
    client, calls = client_for(httpx.ConnectError("down"))
    stats = JudgeStats()
    r = await judge_score(client, CFG, "q", ["a"], "b", stats)
    assert r.reward == CFG.error_score and r.components["judge_error"] == 1.0
    assert stats.errors == 1 and len(calls) == 3  # bounded: RetryPolicy(attempts=3)


async def test_judge_4xx_not_retried():
    client, calls = client_for(httpx.Response(400, json={"error": "bad"}))
    r = await judge_score(client, CFG, "q", ["a"], "b")
    assert r.components["judge_error"] == 1.0 and len(calls) == 1


async def test_judge_parse_failure_reasks_once_then_falls_back():
    client, calls = client_for(httpx.Response(200, json=chat("I think it is fine")))
    stats = JudgeStats()
    r = await judge_score(client, CFG, "q", ["a"], "b", stats)
    assert r.reward == 0.1 and r.components["judge_parse_failed"] == 1.0
    assert stats.parse_failures == 1 and stats.calls == 2 and len(calls) == 2


async def test_judge_malformed_json_does_not_raise():
    client, _ = client_for(httpx.Response(200, json={"unexpected": True}))
    r = await judge_score(client, CFG, "q", ["a"], "b")
    assert r.reward == 0.0 and r.components["judge_error"] == 1.0
