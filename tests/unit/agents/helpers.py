"""In-process stand-ins for unit tests: the scripted fake LLM called without HTTP (through the real
inference client's request builder and response parser), and a deterministic retriever."""

from __future__ import annotations

from recipes.core.context import AgentContext
from recipes.core.llm import PolicyGenerator, PolicyState, _generation
from recipes.core.tokenizer import CharTokenizer
from recipes.core.turns import Budget
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
    state = PolicyState(version=version, model_name="policy", base_model_name="policy")
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
