"""Dynamic sampling (``drop_flat_groups``) against the scripted LLM, the real retriever and a real Redis: a group
whose samples all got the same reward is not published, its admission slot goes to a new prompt at once, and
the prompt is neither re-queued nor blamed; a group with signal is published as before."""

from __future__ import annotations

import asyncio
import itertools

from agents.datasets import load_prompts
from agents.prompts import CharTokenizer
from services.rollout.admission import Admission
from services.rollout.embedding import hashing_embed
from services.rollout.metrics import RolloutMetrics
from services.rollout.producer import Producer, PromptQueue
from services.rollout.runtime import agent_context
from shared.protocol import TrajectoryGroup
from shared.stream import StreamQueue
from testing.fake_llm import _last_question, protocol_script

TOK = CharTokenizer()


async def run(settings, redis_client, admission: Admission, max_groups: int) -> Producer:
    async with agent_context(settings, tok=TOK) as ctx:
        producer = Producer(
            settings,
            ctx,
            client=redis_client,
            embed=hashing_embed,
            metrics=RolloutMetrics(),
            publisher=StreamQueue(redis_client, "trajectories", TrajectoryGroup),
            admission=admission,
            prompts=PromptQueue(load_prompts(settings.dataset), seed=0),
        )
        await asyncio.wait_for(producer.run(max_groups=max_groups), 60)
        return producer


def no_signal_metric(producer: Producer) -> float | None:
    return producer.metrics.registry.get_sample_value("coda_rollout_groups_total", {"outcome": "no_signal"})


async def test_flat_groups_are_not_published_and_free_their_slot(fake_llm, make_settings, redis_client):
    # The scripted policy answers every sample of a prompt alike: every group is flat.
    settings = make_settings(fake_llm.url, agent="search-r1", n_samples=2, max_running_groups=1, drop_flat_groups=True)
    # max_staleness 0, one group per step, version held at 0: room for ONE accepted group. Were a dropped group
    # counted as published (or its slot kept), the second acquire would wait forever and the run time out.
    admission = Admission(0, 1, max_running=1)
    producer = await run(settings, redis_client, admission, max_groups=3)
    assert producer.stats.no_signal == 3 and producer.stats.published == 0 and producer.stats.failed == 0
    assert producer.stats.episodes == 6  # they ran and were scored
    assert redis_client.xlen("trajectories") == 0 and int(redis_client.get(settings.published_key) or 0) == 0
    assert admission.running == 0 and admission.accepted == 0 and admission.capacity == 1
    # three new prompts were taken; none came back to the queue nor counts against it
    assert not producer.prompts.retry and not producer.prompts.attempts and not producer.blamed
    assert len(producer.prompts) == len(producer.prompts.records) - 3
    assert producer.status()["no_signal"] == 3 and no_signal_metric(producer) == 3.0
    prompts = {_last_question(c.prompt_text) for c in fake_llm.calls}
    assert len(prompts) == 3


async def test_groups_with_signal_are_published(fake_llm, make_settings, redis_client):
    golds = {r.question: r.golden_answers[0] for r in load_prompts("bundled:lookup")}
    answers = itertools.count()

    def right_then_wrong(prompt: str, model: str) -> str:
        """The protocol, but the answers alternate: the gold, then a wrong one (groups run one at a time, so each
        group of two gets one of each)."""
        reply = protocol_script(prompt, model)
        if "<answer>" not in reply:
            return reply
        answer = golds[_last_question(prompt)] if next(answers) % 2 == 0 else "nobody at all"
        return f"<think>Found it.</think><answer> {answer} </answer>"

    fake_llm.script = right_then_wrong
    settings = make_settings(fake_llm.url, agent="search-r1", n_samples=2, max_running_groups=1, drop_flat_groups=True)
    producer = await run(settings, redis_client, Admission(5, 10, max_running=1), max_groups=2)
    assert producer.stats.published == 2 and producer.stats.no_signal == 0
    assert no_signal_metric(producer) is None
    queue = StreamQueue(redis_client, "trajectories", TrajectoryGroup, group="check", consumer="t")
    queue.ensure_group()
    for group in (e.message for e in queue.read(count=10)):
        assert len({s.reward for s in group.samples}) == 2


async def test_off_by_default_flat_groups_are_published(fake_llm, make_settings, redis_client):
    settings = make_settings(fake_llm.url, agent="search-r1", n_samples=2, max_running_groups=1)
    assert settings.drop_flat_groups is False
    producer = await run(settings, redis_client, Admission(5, 10, max_running=1), max_groups=2)
    assert producer.stats.published == 2 and producer.stats.no_signal == 0
