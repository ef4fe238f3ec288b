"""Stop strings against BPE merges: a real byte-level BPE tokenizer (as SmolLM2's) has merged tokens such as
``>.`` and ``>,``, so the token that completes ``</task>`` can carry one more character. vLLM (and our
server) then cut the *text* right after the stop string but keep the whole token in the *ids*. The agents
keep the whole token in both: the turn's text is what its ids decode to, and the parser reads the action
before the trailing characters."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agents import get_agent
from agents.core.llm import Generation, whole_tokens
from agents.datasets import PromptRecord
from agents.prompts import PLANNER_SYSTEM, plain_render, plain_turn
from tests.unit.agents.helpers import VLLMLikeGenerator, make_ctx

EOS = "<|eos|>"
CORPUS = [
    "<think>x</think><task>Who wrote Hamlet?</task>. Then <search>hamlet</search>, "
    "<answer>Shakespeare</answer>. Done, <refine>r</refine>."
] * 50


class BPETokenizer:
    """A byte-level BPE tokenizer trained here, used the way ``HFTokenizer`` uses the served model's."""

    def __init__(self) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(
            CORPUS,
            trainers.BpeTrainer(
                vocab_size=400,
                special_tokens=[EOS],
                show_progress=False,
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            ),
        )
        self.tok, self.eos_token_id = tok, tok.token_to_id(EOS)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def render(self, messages) -> list[int]:
        return self.encode(plain_render(messages))

    def tool_turn(self, content: str, role: str = "tool") -> str:
        return plain_turn(content, role)


def coda_script(prompt: str) -> str:
    history = prompt.split("\nAssistant: ", 1)[-1]
    if PLANNER_SYSTEM[:40] in prompt:
        if "<result>" not in history:
            return "<think>x</think><task> Who wrote Hamlet? </task>. Then more"
        return "<answer> William Shakespeare </answer>. Done"
    if "<documents>" not in history:
        return "<search> hamlet </search>, then"
    return "<refine> r </refine><answer> Shakespeare </answer>, done"


async def test_token_that_runs_past_the_stop_string_is_kept_in_text_and_ids():
    tok = BPETokenizer()
    merged = {tok.tok.token_to_id(">."), tok.tok.token_to_id(">,")}
    assert None not in merged  # the merges this test is about exist
    ctx, _ = make_ctx(lambda prompt, model: "")
    ctx.tok = tok
    ctx.policy = llm = VLLMLikeGenerator(tok, coda_script)
    record = PromptRecord(prompt_id="q", question="Who wrote Hamlet", golden_answers=["Shakespeare"])

    episode = await get_agent("coda").run(ctx, record)

    # the parsed actions read past the trailing characters
    assert episode.facts.tasks == ("Who wrote Hamlet?",) and ctx.retriever.queries == ["hamlet"]
    assert episode.facts.executor_answers == ("Shakespeare",) and episode.answer == "William Shakespeare"
    planner, (executor,) = episode.main, episode.children
    assert planner.turns[0].endswith("</task>.") and executor.turns[0].endswith("</search>,")
    # every turn ended on a merged token, and its text is what its ids decode to
    assert [ids[-1] in merged for ids in llm.calls] == [True] * 4
    assert sorted(map(tok.decode, llm.calls)) == sorted(planner.turns + executor.turns)
    for traj in episode.trajectories:  # the whole trajectory: text and ids say the same thing
        assert tok.decode(traj.ids[traj.prompt_len :]) == traj.response_text
    # the ids fed to the next turn are the ones trained on (token-in/token-out held on every call)
    assert sum(planner.mask) == len(llm.calls[0]) + len(llm.calls[3])


def test_whole_tokens_rule():
    tok = BPETokenizer()
    ids = tok.encode("<task> q </task>. x")[:-2]  # ... "</", "task", ">." (the server stopped there)
    assert tok.decode(ids).endswith("</task>.")
    cut = Generation(ids, [0.0] * len(ids), "<task> q </task>", "stop", "</task>", 0)
    assert whole_tokens(cut, tok).text == "<task> q </task>."
    # a server asked to leave the stop string out of the text: the text still covers the whole ids
    assert whole_tokens(replace(cut, text="<task> q "), tok).text == "<task> q </task>."
    exact = tok.encode("<task> q </task>")
    assert tok.decode(exact).endswith("</task>")
    done = Generation(exact, [0.0] * len(exact), "<task> q </task>", "stop", "</task>", 0)
    assert whole_tokens(done, tok) is done  # nothing past the stop string: unchanged
    eos = Generation([*exact, tok.eos_token_id], [0.0] * (len(exact) + 1), "<task> q </task>", "stop", None, 0)
    assert whole_tokens(eos, tok) is eos  # EOS (and length) turns are the server's text as is
    with pytest.raises(ValueError, match="not found"):  # ids that never completed the reported stop string
        whole_tokens(replace(cut, stop_reason="</answer>"), tok)
