"""Every recipe for a couple of groups with the real pieces: the CPU inference server with a tiny random
model, the real retriever, the real searcher service (thinker-searcher) and a real Redis. The published
messages must validate as ``TrajectoryGroup`` and keep the token-level contract."""

from __future__ import annotations

import asyncio

import pytest

from agents.datasets import load_prompts
from agents.prompts import (
    HFTokenizer,
    decomposer_prompt,
    planner_messages,
    search_agent_messages,
    tool_agent_messages,
)
from services.rollout.admission import Admission
from services.rollout.config import RolloutSettings
from services.rollout.embedding import hashing_embed
from services.rollout.metrics import RolloutMetrics
from services.rollout.producer import Producer, PromptQueue
from services.rollout.runtime import agent_context
from services.searcher.app import build_app as build_searcher
from services.searcher.config import SearcherSettings
from shared.protocol import TrajectoryGroup
from shared.stream import StreamQueue
from testing.serving import ThreadedServer
from tests.integration.rollout.servers import inference_server, tiny_model

ROLES = {
    "search-r1": {"policy"},
    "coda": {"planner", "executor"},
    "thinker-searcher": {"thinker"},
    "recursive-reasoner": {"planner"},
    "tool-agent": {"policy"},
}


@pytest.fixture(scope="module")
def tok():
    return HFTokenizer(str(tiny_model()))


@pytest.fixture(scope="module")
def searcher_url(tok, retriever_url):
    settings = SearcherSettings(
        inference_url=inference_server(), retriever_url=retriever_url, max_turns=2, max_tokens_per_turn=24
    )
    with ThreadedServer(build_searcher(settings, tok=tok)) as url:
        yield url


def first_prompt(agent: str, question: str, tok) -> list[int]:
    if agent == "coda":
        return tok.render(planner_messages(question))
    if agent == "recursive-reasoner":
        return tok.encode(decomposer_prompt(question))
    if agent == "tool-agent":
        return tok.render(tool_agent_messages(question))
    return tok.render(search_agent_messages(question))


@pytest.mark.parametrize("agent", sorted(ROLES))
async def test_recipe_with_real_services(agent, tok, retriever_url, searcher_url, redis_server, redis_client):
    settings = RolloutSettings.load(
        agent=agent,
        tokenizer=str(tiny_model()),
        inference_url=inference_server(),
        retriever_url=retriever_url,
        searcher_url=searcher_url,
        redis_url=redis_server.url,
        n_samples=2,
        max_turns=2,
        coda={"executor_max_turns": 1},
        max_tokens_per_turn=24,
        recursive_reasoner={"worker_max_tokens": 24},
        search_r1={"searcher_max_turns": 1},
        retry_backoff_s=0.05,
        dataset="synthetic:arithmetic:8" if agent == "recursive-reasoner" else "bundled:lookup",
    )
    records = load_prompts(settings.dataset)
    async with agent_context(settings, tok=tok) as ctx:
        producer = Producer(
            settings,
            ctx,
            client=redis_client,
            embed=hashing_embed,
            metrics=RolloutMetrics(),
            publisher=StreamQueue(redis_client, "trajectories", TrajectoryGroup),
            admission=Admission(0, 2),
            prompts=PromptQueue(records, seed=0),
        )
        await asyncio.wait_for(producer.run(max_groups=2), 120)
    assert producer.stats.published == 2, producer.failures
    queue = StreamQueue(redis_client, "trajectories", TrajectoryGroup, group="check", consumer="t")
    queue.ensure_group()
    groups = [e.message for e in queue.read(count=10)]  # validated against the protocol types on read
    assert len(groups) == 2 and len({g.group_id for g in groups}) == 2
    questions = {r.prompt_id: r.question for r in records}
    for group in groups:
        assert group.agent == agent and group.policy_version == 0
        mains = [s for s in group.samples if s.parent_id is None]
        assert len(mains) == 2 and {s.role for s in group.samples} <= ROLES[agent]
        for s in mains:
            assert s.token_ids[: s.prompt_len] == first_prompt(agent, questions[group.prompt_id], tok)
        for s in group.samples:
            trained = [i for i, m in enumerate(s.loss_mask) if m]
            assert trained and trained[0] >= s.prompt_len
            assert all(s.versions[i] == 0 and s.logprobs[i] <= 0 for i in trained)
            assert all(s.versions[i] == -1 for i in range(len(s.token_ids)) if not s.loss_mask[i])
            assert s.num_turns >= 1 and s.reward_components
