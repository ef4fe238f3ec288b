"""``env_turn``: where the environment's text goes. Inline (Search-R1's convention) it sits inside the assistant's
turn, and an instruct model reads it as its own words; as a ``user``/``tool`` turn the model's own chat template
closes the assistant's turn, holds the observation (or message) and opens the next assistant turn. Either way the
ids are built by appending, the text and ids agree, only sampled tokens are trained, rewards read only what the
policy wrote, and make-sft's demonstrations are the same token sequence a rollout builds."""

from __future__ import annotations

import pytest

from agents import get_agent
from agents.base import Scoring
from agents.core.turns import Budget
from agents.datasets import PromptRecord
from agents.prompts import CharTokenizer, HFTokenizer, env_frame, format_documents
from agents.search_r1 import demonstration, reward
from tests.unit.agents.helpers import VLLMLikeGenerator, make_ctx, smol_template_folder

CLOSE_ASSISTANT = "<|im_end|>\n"
USER_OPEN, ASSISTANT_OPEN = "<|im_start|>user\n", "<|im_start|>assistant\n"
RECORD = PromptRecord(prompt_id="q", question="Who wrote Hamlet", golden_answers=["Shakespeare"])


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return HFTokenizer(smol_template_folder(tmp_path_factory.mktemp("smol")), system_prompt="")


def test_frames_rendered_by_the_chat_template(tok):
    assert env_frame(tok, "inline") == ("", "")
    assert env_frame(tok, "user") == (CLOSE_ASSISTANT + USER_OPEN, CLOSE_ASSISTANT + ASSISTANT_OPEN)
    assert env_frame(tok, "tool") == (CLOSE_ASSISTANT + "<|im_start|>tool\n", CLOSE_ASSISTANT + ASSISTANT_OPEN)
    assert env_frame(CharTokenizer(), "user") == ("\n\nUser: ", "\nAssistant: ")  # no template: the plain layout
    with pytest.raises(ValueError, match="inline, user, tool"):
        env_frame(tok, "system")


def search_then_answer(prompt: str) -> str:
    """Searches first; answers once documents are in the context (the answer tag also appears in the
    environment's own text, which no reward may read)."""
    return "<answer> Shakespeare </answer>" if "Doc 1(Title:" in prompt else "<search> Who wrote Hamlet </search>"


def score(episode):
    return reward(episode, Scoring(record=RECORD, settings=None, metric="f1"))


def episode_ctx(tok, env_turn: str, script):
    ctx, _ = make_ctx(lambda prompt, model: "")
    ctx.tok, ctx.env_frame = tok, env_frame(tok, env_turn)
    ctx.policy = VLLMLikeGenerator(tok, script)
    ctx.topk = 1
    return ctx


async def test_observation_as_a_user_turn(tok):
    ctx = episode_ctx(tok, "user", search_then_answer)
    episode = await get_agent("search-r1").run(ctx, RECORD)
    traj, llm = episode.main, ctx.policy

    assert episode.answer == "Shakespeare"
    assert traj.turns == ["<search> Who wrote Hamlet </search>", "<answer> Shakespeare </answer>"]
    (observation,) = [s for s in traj.segments if s.source == "observation"]
    assert observation.text.startswith(CLOSE_ASSISTANT + USER_OPEN + "\n\n<information>")
    assert observation.text.endswith("</information>\n\n" + CLOSE_ASSISTANT + ASSISTANT_OPEN)
    assert traj.observations("information") == [
        'Doc 1(Title: "Title Who wrote Hamlet 0") Text about Who wrote Hamlet.\n'
    ]
    # the second turn was asked for at the start of a fresh assistant turn, on exactly the ids gathered so far
    assert tok.decode(llm.prompts[1]).endswith(ASSISTANT_OPEN) and llm.prompts[1] == traj.ids[: len(llm.prompts[1])]
    # text and ids agree; only the sampled tokens are trained
    assert tok.decode(traj.ids[traj.prompt_len :]) == traj.response_text
    first, second = llm.calls
    observed = len(traj.ids) - traj.prompt_len - len(first) - len(second)
    assert traj.mask == [0] * traj.prompt_len + [1] * len(first) + [0] * observed + [1] * len(second)
    assert score(episode).components["f1"] == 1.0


async def test_an_invalid_turn_gets_its_message_as_a_user_turn_and_no_reward_reads_it(tok):
    # A model that never acts: its first turn runs out of tokens, the message comes back as a user turn, and
    # after the forced final turn the episode has no answer, although the environment's text says "<answer>".
    ctx = episode_ctx(tok, "user", lambda prompt: "I think the answer is Shakespeare, certainly.")
    ctx.budgets["policy"] = Budget(max_turns=1, max_tokens=12, max_obs_tokens=500)
    episode = await get_agent("search-r1").run(ctx, RECORD)
    traj = episode.main
    messages = [s.text for s in traj.segments if s.source == "message"]
    assert len(messages) == 2 and all(m.startswith(CLOSE_ASSISTANT + USER_OPEN) for m in messages)
    assert all(m.endswith(CLOSE_ASSISTANT + ASSISTANT_OPEN) and "<answer>" in m for m in messages)
    assert episode.answer is None
    result = score(episode)
    assert result.components["f1"] == 0.0 and result.components["has_answer"] == 0.0


@pytest.mark.parametrize("env_turn", ["inline", "user"])
async def test_demonstrations_are_the_ids_a_rollout_builds(tok, env_turn):
    ctx = episode_ctx(tok, env_turn, search_then_answer)
    episode = await get_agent("search-r1").run(ctx, RECORD)
    docs = (await ctx.retriever.retrieve([RECORD.question], topk=1))[0]
    ids, mask = demonstration(
        tok,
        RECORD.question,
        "Shakespeare",
        format_documents([(d.title, d.text) for d in docs]),
        think=False,
        frame=env_frame(tok, env_turn),
    )
    traj = episode.main
    # the demonstration ends its answer with EOS; the rollout's turn stopped at </answer>
    assert ids[:-1] == traj.ids and ids[-1] == tok.eos_token_id
    assert mask[:-1] == traj.mask
