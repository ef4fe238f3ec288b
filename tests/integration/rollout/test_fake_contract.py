"""Contract: the scripted fake LLM answers the same request in the same shape as the real CPU inference
server (which mirrors vLLM), so what the agents are tested against is what they meet in production."""

from __future__ import annotations

import httpx

from agents.prompts import CharTokenizer, HFTokenizer, search_agent_messages
from shared.inference_client import completion_body, parse_completion
from testing.fake_llm import FakeLLM, protocol_script
from testing.serving import ThreadedServer
from tests.integration.rollout.servers import inference_server, tiny_model


def shape(body: dict) -> dict:
    choice = body["choices"][0]
    return {
        "top": sorted(body),
        "choice": sorted(k for k in choice if choice[k] is not None),
        "logprobs": sorted(choice["logprobs"]),
        "usage": sorted(body["usage"]),
    }


def test_fake_and_real_server_answer_in_the_same_shape():
    real_tok = HFTokenizer(str(tiny_model()))
    stops = ["</search>", "</answer>"]
    real_body = completion_body(
        "policy", real_tok.render(search_agent_messages("Where does Sidar live?")), max_tokens=12, stop=stops
    )
    real = httpx.post(f"{inference_server()}/v1/completions", json=real_body, timeout=60).json()
    fake = FakeLLM(CharTokenizer(), protocol_script)
    with ThreadedServer(fake.app()) as url:
        fake_body = completion_body(
            "policy", CharTokenizer().render(search_agent_messages("Where does Sidar live?")), max_tokens=12, stop=stops
        )
        faked = httpx.post(f"{url}/v1/completions", json=fake_body, timeout=10).json()
        long_body = {**fake_body, "max_tokens": 400}
        stopped = httpx.post(f"{url}/v1/completions", json=long_body, timeout=10).json()
    assert shape(faked) == shape(real)
    for body in (real, faked, stopped):
        out = parse_completion(body)  # the production parser accepts both
        choice = out.choices[0]
        assert len(choice.token_ids) == len(choice.logprobs) and all(lp <= 0 for lp in choice.logprobs)
        tokens = body["choices"][0]["logprobs"]["tokens"]
        assert tokens == [f"token_id:{i}" for i in choice.token_ids]
    assert parse_completion(faked).choices[0].finish_reason == "length"  # 12 tokens: capped, like the real one
    assert parse_completion(real).choices[0].finish_reason in ("length", "stop")
    hit = parse_completion(stopped).choices[0]
    assert hit.finish_reason == "stop" and hit.stop_reason == "</search>" and hit.text.endswith("</search>")
