"""Each recipe's protocol, checked exactly against a scripted policy (the fake LLM, called in process)."""

from __future__ import annotations

import pytest

from agents import get_agent
from agents.core.episode import Episode
from agents.core.turns import Budget
from agents.datasets import PromptRecord
from agents.prompts import (
    FINAL_ANSWER_NUDGE,
    INVALID_PLANNER_ACTION,
    INVALID_SEARCH_ACTION,
    PLANNER_SYSTEM,
    executor_messages,
    search_agent_messages,
)
from agents.tool_agent import chat
from shared.protocol.search import SearchResponse
from testing.fake_llm import fake_logprob
from tests.unit.agents.helpers import make_ctx, scripted

RECORD = PromptRecord(prompt_id="q1", question="Who wrote Hamlet", golden_answers=["Shakespeare"])


def assert_token_accounting(episode: Episode, fake, version: int) -> None:
    """TITO, masks, logprobs and versions, checked against what the server actually returned."""
    calls = {tuple(c.prompt_ids): c for c in fake.calls}
    for traj in episode.trajectories:
        sample = traj.to_sample()
        trained = [i for i, m in enumerate(sample.loss_mask) if m]
        # Re-derive the expected mask from the recorded calls: a call's generated ids sit right after its prompt.
        expected = set()
        for end in range(sample.prompt_len, len(sample.token_ids) + 1):
            call = calls.get(tuple(sample.token_ids[:end]))
            if call is not None:
                assert sample.token_ids[end : end + len(call.token_ids)] == call.token_ids  # token-in/token-out
                expected.update(range(end, end + len(call.token_ids)))
                for k, pos in enumerate(range(end, end + len(call.token_ids))):
                    assert sample.logprobs[pos] == pytest.approx(fake_logprob(k))
                    assert sample.versions[pos] == version
        assert set(trained) == expected, "mask must be 1 exactly on the sampled tokens"
        assert all(
            sample.versions[i] == -1 and sample.logprobs[i] == 0.0
            for i in range(len(sample.token_ids))
            if not sample.loss_mask[i]
        )


async def test_search_r1_search_then_answer():
    ctx, fake = make_ctx(
        scripted(
            "<think>need it</think><search> hamlet author </search> ignored tail",
            "<think>found</think><answer> Shakespeare </answer>",
        )
    )
    episode = await get_agent("search-r1").run(ctx, RECORD)
    assert episode.answer == "Shakespeare"
    first, second = fake.calls
    assert first.stop == ["</search>", "</answer>"]
    assert first.text.endswith("</search>") and "ignored" not in first.text
    assert ctx.retriever.queries == ["hamlet author"]
    # the second prompt is exactly the first prompt + its generated ids + the observation ids
    obs_ids = second.prompt_ids[len(first.prompt_ids) + len(first.token_ids) :]
    assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids
    obs_text = ctx.tok.decode(obs_ids)
    assert obs_text.startswith('\n\n<information>Doc 1(Title: "Title hamlet author 0") Text about hamlet author.')
    assert obs_text.endswith("</information>\n\n")
    assert first.prompt_ids == ctx.tok.render(search_agent_messages("Who wrote Hamlet"))
    assert_token_accounting(episode, fake, version=3)
    assert episode.main.finish_reason == "stop"


async def test_eos_is_kept_and_trained():
    ctx, fake = make_ctx(scripted("I do not know"))  # no stop string: the model ends with EOS
    episode = await get_agent("search-r1").run(ctx, RECORD)
    sample = episode.main.to_sample()
    assert sample.token_ids[-1] == ctx.tok.eos_token_id and sample.loss_mask[-1] == 1
    assert episode.answer is None and len(fake.calls) == 1


async def test_invalid_action_message_then_recovery():
    ctx, fake = make_ctx(scripted("I will just ramble </search>", "<answer> Shakespeare </answer>"))
    episode = await get_agent("search-r1").run(ctx, RECORD)
    assert episode.answer == "Shakespeare"
    assert ctx.retriever.queries == []
    assert fake.calls[1].prompt_text.endswith(INVALID_SEARCH_ACTION)
    assert episode.invalid_turns == 1
    assert_token_accounting(episode, fake, version=3)


async def test_turn_budget_then_forced_final_turn():
    budget = Budget(max_turns=2, max_tokens=400, max_obs_tokens=300, max_context_tokens=20000)
    ctx, fake = make_ctx(
        scripted("<search> a </search>", "<search> b </search>", "<search> c </search>"), budgets={"policy": budget}
    )
    episode = await get_agent("search-r1").run(ctx, RECORD)
    assert len(fake.calls) == 3 and ctx.retriever.queries == ["a", "b"]  # the forced turn executes nothing
    final = fake.calls[-1]
    assert final.stop == ["</answer>"] and final.prompt_text.endswith(FINAL_ANSWER_NUDGE)
    assert episode.answer is None and episode.main.finish_reason == "budget"


async def test_observation_truncated_inside_intact_tags():
    budget = Budget(max_turns=3, max_tokens=400, max_obs_tokens=12, max_context_tokens=20000)
    ctx, fake = make_ctx(scripted("<search> q </search>", "<answer> x </answer>"), budgets={"policy": budget})
    await get_agent("search-r1").run(ctx, RECORD)
    first, second = fake.calls
    obs = ctx.tok.decode(second.prompt_ids[len(first.prompt_ids) + len(first.token_ids) :])
    assert obs == "\n\n<information>" + "Doc 1(Title:" + "</information>\n\n"


async def test_context_cap_ends_episode_with_length():
    prompt_len = len(CTX_TOK.render(search_agent_messages("Who wrote Hamlet")))
    budget = Budget(max_turns=5, max_tokens=400, max_obs_tokens=300, max_context_tokens=prompt_len + 30)
    ctx, fake = make_ctx(scripted("<search> q </search>", "<search> r </search>"), budgets={"policy": budget})
    episode = await get_agent("search-r1").run(ctx, RECORD)
    assert fake.calls[0].max_tokens == 30
    assert episode.main.finish_reason == "length" and len(fake.calls) == 1
    assert len(episode.main.ids) > budget.max_context_tokens - 1


def episode_part(prompt: str) -> str:
    return prompt.split("\nAssistant: ", 1)[-1]  # the instructions mention the tags; skip them


def coda_script(prompt: str, model: str) -> str:
    if PLANNER_SYSTEM[:40] in prompt:
        if "<result>" not in episode_part(prompt):
            return "<think>split it</think><task> Who wrote Hamlet? </task> should be cut"
        return "<think>done</think><answer> William Shakespeare </answer>"
    if "<documents>" not in episode_part(prompt):
        return "<think>search</think><search> hamlet author </search>"
    return "<refine>Hamlet is by Shakespeare.</refine><answer> William Shakespeare </answer>"


async def test_coda_delegation_isolation_and_result_insertion():
    ctx, fake = make_ctx(coda_script)
    episode = await get_agent("coda").run(ctx, RECORD)
    assert episode.answer == "William Shakespeare"
    planner, (executor,) = episode.main, episode.children
    assert executor.role == "executor" and executor.parent_id == planner.sample_id
    # executor isolation: its first prompt is its own instructions + the task, nothing of the planner
    exec_first = next(
        c for c in fake.calls if "Who wrote Hamlet?" in c.prompt_text and PLANNER_SYSTEM[:40] not in c.prompt_text
    )
    assert exec_first.prompt_ids == ctx.tok.render(executor_messages("Who wrote Hamlet?"))
    assert "split it" not in exec_first.prompt_text
    # only the executor's answer text returns, inside <result>; no documents or refine leak to the planner
    planner_last = [c for c in fake.calls if PLANNER_SYSTEM[:40] in c.prompt_text][-1]
    tail = planner_last.prompt_text.rsplit("</task>", 1)[1]
    assert tail == "\n<result>William Shakespeare</result>\n"
    assert fake.calls[0].stop == ["</task>", "</answer>"]
    assert_token_accounting(episode, fake, version=3)
    assert episode.facts.executor_answers == ("William Shakespeare",)


async def test_coda_executor_out_of_budget_returns_empty_result():
    budgets = {
        "planner": Budget(max_turns=2, max_tokens=400, max_obs_tokens=300, max_context_tokens=20000),
        "executor": Budget(max_turns=1, max_tokens=400, max_obs_tokens=300, max_context_tokens=20000),
    }

    def script(prompt: str, model: str) -> str:
        if PLANNER_SYSTEM[:40] in prompt:
            return "<answer> none </answer>" if "<result>" in episode_part(prompt) else "<task> t </task>"
        return "<search> again </search>"  # the executor never answers, even in its forced turn

    ctx, fake = make_ctx(script, budgets=budgets)
    episode = await get_agent("coda").run(ctx, RECORD)
    assert "</task>\n<result></result>\n" in fake.calls[-1].prompt_text
    assert episode.children[0].finish_reason == "budget" and episode.answer == "none"


async def test_coda_invalid_planner_action():
    # <search> is not a planner action: the turn (cut at </task>) holds no task or answer, so it is invalid
    ctx, fake = make_ctx(scripted("<search> not mine </search> </task>", "<answer> x </answer>"))
    episode = await get_agent("coda").run(ctx, RECORD)
    assert fake.calls[1].prompt_text.endswith(INVALID_PLANNER_ACTION) and episode.answer == "x"
    assert ctx.retriever.queries == []


class FakeSearcher:
    def __init__(self) -> None:
        self.calls = []

    async def search(self, query, max_turns=None):
        self.calls.append((query, max_turns))
        return SearchResponse(summary="William Shakespeare", trajectory=[], num_searches=2, success=True)


async def test_thinker_delegates_search_to_searcher():
    ctx, fake = make_ctx(scripted("<search> hamlet author </search>", "<answer> Shakespeare </answer>"))
    ctx.searcher, ctx.searcher_max_turns = FakeSearcher(), 2
    episode = await get_agent("thinker-searcher").run(ctx, RECORD)
    assert ctx.searcher.calls == [("hamlet author", 2)] and ctx.retriever.queries == []
    assert "<information>William Shakespeare</information>" in fake.calls[1].prompt_text
    assert episode.main.role == "thinker" and episode.answer == "Shakespeare"
    assert_token_accounting(episode, fake, version=3)


async def test_recursive_reasoner_planner_trained_worker_frozen():
    plan = '{"should_decompose": true, "subproblems": ["3 boxes of 4", "add 1"], "plan": "multiply then add"}'

    def worker(prompt: str, model: str) -> str:
        return '{"final_answer": 13}' if "Put these partial results" in prompt else '{"result": 12}'

    ctx, fake = make_ctx(scripted(plan), frozen_script=worker)
    record = PromptRecord(prompt_id="m1", question="3 boxes of 4 apples and 1 more?", golden_answers=["13"])
    episode = await get_agent("recursive-reasoner").run(ctx, record)
    assert episode.answer == "13" and episode.facts.decomposed and episode.facts.parsed
    assert len(fake.calls) == 1 and episode.children == []
    worker_fake = ctx.frozen.fake
    assert [c.model for c in worker_fake.calls] == ["frozen"] * 3
    assert episode.facts.worker_tokens == sum(len(c.token_ids) for c in worker_fake.calls)
    assert_token_accounting(episode, fake, version=3)


async def test_tool_agent_call_then_reply():
    ctx, fake = make_ctx(
        scripted(
            '<think>look</think><tool_call>{"name": "search", "arguments": {"query": "hamlet"}}</tool_call>',
            "<think>ok</think> Shakespeare",
        )
    )
    episode = await get_agent("tool-agent").run(ctx, RECORD)
    assert ctx.retriever.queries == ["hamlet"] and episode.answer == "Shakespeare"
    assert "<tool_response>" in fake.calls[1].prompt_text and episode.search.retrieved_ids == (("0", "1", "2"),)
    assert [m["role"] for m in chat(episode.main)] == ["assistant", "tool", "assistant"]
    assert_token_accounting(episode, fake, version=3)


async def test_lora_version_switch_changes_model_and_token_versions():
    ctx, fake = make_ctx(scripted("<search> q </search>", "<answer> a </answer>"))
    fake.loras["policy-v4"] = "/w/4"
    orig = ctx.policy.generate

    async def bump_after_first(prompt_ids, *, stop, max_tokens):
        gen = await orig(prompt_ids, stop=stop, max_tokens=max_tokens)
        ctx.policy.state.advance(4, "policy-v4")
        return gen

    ctx.policy.generate = bump_after_first
    episode = await get_agent("search-r1").run(ctx, RECORD)
    assert [c.model for c in fake.calls] == ["policy", "policy-v4"]
    trained_versions = [v for v, m in zip(episode.main.versions, episode.main.mask, strict=True) if m]
    assert set(trained_versions) == {3, 4} and episode.main.to_sample().min_version() == 3


from agents.prompts import CharTokenizer  # noqa: E402

CTX_TOK = CharTokenizer()


async def test_tasks_of_one_planner_turn_run_concurrently():
    """Two tasks in one planner turn (a model that writes both before its stop string fires): both
    executors must be in flight together, and both results come back in task order."""
    import asyncio

    from agents.core.llm import Generation

    barrier = asyncio.Barrier(2)
    tok = CTX_TOK

    class TwoTasks:
        async def generate(self, prompt_ids, *, stop, max_tokens):
            prompt = tok.decode(prompt_ids)
            if PLANNER_SYSTEM[:40] in prompt:
                text = (
                    "<answer> both </answer>"
                    if "<result>" in episode_part(prompt)
                    else "<task> first? </task><task> second? </task>"
                )
            else:
                await asyncio.wait_for(barrier.wait(), 2)  # deadlocks (times out) if executors run one by one
                text = f"<answer> {episode_part(prompt).strip() or prompt.split('Question: ')[-1][:7]} </answer>"
            ids = tok.encode(text)
            return Generation(ids, [-0.5] * len(ids), text, "stop", text[text.rindex("</") :], 3)

    ctx, _ = make_ctx(scripted())
    ctx.policy = TwoTasks()
    episode = await get_agent("coda").run(ctx, RECORD)
    assert episode.facts.tasks == ("first?", "second?") and len(episode.children) == 2
    results = episode.main.response_text.split("</task>")[-1]
    assert results.count("<result>") == 2 and results.index("first?") < results.index("second?")
