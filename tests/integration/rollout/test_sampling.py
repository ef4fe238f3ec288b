"""The rollout's sampling settings reach the inference server: ``[rollout] top_k`` (and temperature, top_p) are
in the body of every completion request the policy sends, as it goes over the wire; the greedy eval sends
none of them on."""

from __future__ import annotations

from aiohttp import web

from agents.prompts import CharTokenizer
from services.rollout.config import RolloutSettings
from services.rollout.runtime import agent_context
from shared.inference_client import completion_body
from shared.protocol.inference import CompletionRequest
from testing.fake_llm import FakeLLM, protocol_script
from tests.integration.rollout.servers import completions_stub


def test_the_request_body_carries_top_k_and_it_is_a_field_of_the_wire_type():
    assert completion_body("policy", [1, 2], max_tokens=4)["top_k"] == 0  # off unless asked
    body = completion_body("policy", [1, 2], max_tokens=4, top_k=5)
    assert CompletionRequest.model_validate(body).top_k == 5


async def _bodies_sent(settings: RolloutSettings, *, greedy: bool) -> list[dict]:
    """The JSON bodies a policy built from ``settings`` sends to a server that records them (the fake LLM
    answers)."""
    fake, seen = FakeLLM(CharTokenizer(), protocol_script), []

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        return web.json_response(fake.complete(CompletionRequest.model_validate(body)).model_dump())

    async with completions_stub(completions) as url:
        update = {"inference_url": url}
        async with agent_context(settings.model_copy(update=update), greedy=greedy, tok=CharTokenizer()) as ctx:
            await ctx.policy.generate([1, 2, 3], stop=[], max_tokens=4)
    return seen


async def test_rollout_top_k_is_sent_with_every_policy_request():
    settings = RolloutSettings.load(tokenizer="char", top_k=7, top_p=0.9, temperature=0.7)
    sent = await _bodies_sent(settings, greedy=False)
    assert [(b["top_k"], b["top_p"], b["temperature"]) for b in sent] == [(7, 0.9, 0.7)]
    greedy = await _bodies_sent(settings, greedy=True)  # the held-out eval: greedy, no truncation
    assert [(b["top_k"], b["top_p"], b["temperature"]) for b in greedy] == [(0, 1.0, 0.0)]
