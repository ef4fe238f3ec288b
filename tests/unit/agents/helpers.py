"""In-process stand-ins for unit tests: the scripted fake LLM called without HTTP (through the real
inference client's request builder and response parser), a generator that stops the way vLLM does, a
deterministic retriever, and a tokenizer folder with SmolLM2's chat template."""

from __future__ import annotations

import string
from pathlib import Path

from agents.core.episode import AgentContext
from agents.core.llm import Generation, PolicyGenerator, PolicyState, _generation
from agents.core.turns import Budget
from agents.prompts import CharTokenizer
from shared.inference_client import completion_body, parse_completion
from shared.protocol.inference import CompletionRequest
from shared.protocol.retrieval import RetrievedDocument
from testing.fake_llm import FakeLLM


class InProcessGenerator(PolicyGenerator):
    def __init__(self, fake: FakeLLM, state: PolicyState, frozen_model: str | None = None) -> None:
        self.fake, self.state, self.frozen_model = fake, state, frozen_model

    async def generate(self, prompt_ids, *, stop, max_tokens):
        model = self.frozen_model or self.state.model_name
        body = completion_body(model, list(prompt_ids), max_tokens=max_tokens, stop=list(stop))
        out = parse_completion(self.fake.complete(CompletionRequest(**body)).model_dump())
        return _generation(out.choices[0], -1 if self.frozen_model else self.state.version)


class FakeRetriever:
    def __init__(self) -> None:
        self.queries: list[str] = []

    async def retrieve(self, queries, topk=None):
        self.queries += list(queries)
        return [
            [
                RetrievedDocument(
                    id=str(i), contents=f'"Title {q.strip()} {i}"\nText about {q.strip()}.', score=1.0 / (i + 1)
                )
                for i in range(topk or 3)
            ]
            for q in queries
        ]


def make_ctx(script, *, version: int = 3, budgets: dict | None = None, frozen_script=None):
    tok = CharTokenizer()
    fake = FakeLLM(tok, script)
    state = PolicyState(version=version, model_name="policy", served_model_name="policy")
    frozen = None
    if frozen_script is not None:
        frozen = InProcessGenerator(FakeLLM(tok, frozen_script), state, frozen_model="frozen")
    ctx = AgentContext(
        tok=tok,
        policy=InProcessGenerator(fake, state),
        retriever=FakeRetriever(),
        frozen=frozen,
        budgets=budgets
        or {
            r: Budget(max_turns=3, max_tokens=400, max_obs_tokens=300, max_context_tokens=20000)
            for r in ("policy", "planner", "executor", "thinker", "worker")
        },
    )
    return ctx, fake


def scripted(*replies: str):
    """A script that plays ``replies`` in order, whatever the prompt."""
    queue = list(replies)

    def script(prompt: str, model: str) -> str:
        return queue.pop(0) if queue else "<answer> out of script </answer>"

    return script


class VLLMLikeGenerator:
    """Samples a scripted reply token by token and stops the way vLLM does: at the first stop string in the
    decoded text (``include_stop_str_in_output``: the text is cut right after it; the ids keep the whole token
    that completed it), else at EOS (kept in the ids, not in the text). ``calls`` holds each turn's ids and
    ``prompts`` each turn's prompt ids."""

    def __init__(self, tok, script) -> None:
        self.tok, self.script, self.calls, self.prompts = tok, script, [], []

    async def generate(self, prompt_ids, *, stop, max_tokens):
        self.prompts.append(list(prompt_ids))
        reply = self.tok.encode(self.script(self.tok.decode(list(prompt_ids))))
        ids: list[int] = []
        for token in reply[:max_tokens]:
            ids.append(token)
            text = self.tok.decode(ids)
            hits = [(text.find(s), s) for s in stop if s in text]
            if hits:
                index, string = min(hits)
                return self._done(ids, text[: index + len(string)], "stop", string)
        if len(ids) == max_tokens:
            return self._done(ids, self.tok.decode(ids), "length", None)
        return self._done([*ids, self.tok.eos_token_id], self.tok.decode(ids), "stop", None)

    def _done(self, ids, text, finish, reason) -> Generation:
        self.calls.append(ids)
        return Generation(list(ids), [-0.1] * len(ids), text, finish, reason, 3)


# SmolLM2-135M-Instruct's chat template, as its tokenizer_config.json ships it.
SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def smol_template_folder(out: Path) -> str:
    """A tokenizer folder with SmolLM2's chat template and special tokens (``<|im_start|>``, ``<|im_end|>`` =
    EOS) over one token per printable ASCII character: what ``HFTokenizer`` loads for the real model, small."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(["<unk>", *string.printable])}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    raw.decoder = decoders.Fuse()  # characters back to text with nothing between them
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", eos_token="<|im_end|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = SMOL_TEMPLATE
    tok.save_pretrained(out)
    return str(out)
