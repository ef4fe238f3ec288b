"""PolicyGenerator against a server that restarted: tokens from weights older than the live version are not
sent out while the rollout loads the weights again (the generator only waits); they are after ``behind_wait_s``."""

from __future__ import annotations

from agents.core.llm import PolicyGenerator, PolicyState
from agents.prompts import CharTokenizer
from shared.inference_client import completion_body, parse_completion
from shared.protocol.inference import CompletionRequest
from testing.fake_llm import FakeLLM
from tests.unit.agents.helpers import scripted


class Restarted:
    """The fake LLM over the real request builder and parser; serves ``versions`` in turn, one per call."""

    def __init__(self, versions: list[int | None]) -> None:
        self.fake = FakeLLM(CharTokenizer(), scripted("Orvale"))
        self.versions = versions
        self.calls = 0

    async def complete(self, model, prompt, **kwargs):
        self.fake.weight_version = self.versions[min(self.calls, len(self.versions) - 1)]
        self.calls += 1
        body = completion_body(model, prompt, **kwargs)
        return parse_completion(self.fake.complete(CompletionRequest(**body)).model_dump())


def _generator(client, **kwargs) -> PolicyGenerator:
    return PolicyGenerator(client, PolicyState(version=5), behind_retry_s=0.01, **kwargs)


async def test_a_server_behind_the_live_version_is_asked_again_until_it_catches_up(caplog):
    caplog.set_level("INFO", logger="agents.core.llm")
    client = Restarted([0, 0, 5])
    gen = _generator(client)
    out = await gen.generate([1, 2, 3], stop=[], max_tokens=4)
    assert (client.calls, out.version) == (3, 5)
    assert not gen.behind
    assert "serves older weights" in caplog.text and "serves the live weights again" in caplog.text


async def test_after_behind_wait_s_the_tokens_go_out_with_the_version_that_sampled_them():
    client = Restarted([0])
    out = await _generator(client, behind_wait_s=0.05).generate([1, 2, 3], stop=[], max_tokens=4)
    assert out.version == 0 and client.calls > 2


async def test_a_server_ahead_or_silent_is_taken_at_its_word():
    assert (await _generator(Restarted([6])).generate([1], stop=[], max_tokens=4)).version == 6  # reload landed
    client = Restarted([None])  # vLLM reports no version: the live one is stamped
    assert (await _generator(client).generate([1], stop=[], max_tokens=4)).version == 5 and client.calls == 1
