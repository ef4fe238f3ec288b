"""Every prompt and every environment-inserted text of the agents, defined once and in our own words, and the
tokenizers that render and encode them.

What must match the upstream projects (``docs/upstream.md``) is the *tag protocol* (which tags a role writes,
which the environment inserts, how observations are wrapped), not their sentences. Tags come from
``shared.tags``. Data prep, rollout, the searcher and eval all import these functions, so a prompt change
happens in exactly one place.

Prompts are returned as chat messages (``[{"role", "content"}]``); the tokenizer renders them with the
model's chat template, or as ``system + user + "\\nAssistant: "`` for base models without one.

The tokenizers (``TokenizerLike``) build token-in/token-out prompts and observations. The agents only ever
*append*: a prompt is rendered and encoded once at the start of an episode, every
observation is encoded on its own and appended. ``HFTokenizer`` wraps the served model's own tokenizer
(``transformers``, no torch needed); ``CharTokenizer`` is a tiny deterministic tokenizer for fakes, tests
and benchmarks (one id per character).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from shared.tags import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, TOOL_RESPONSE_CLOSE, TOOL_RESPONSE_OPEN

Messages = list[dict[str, str]]

# ---------------------------------------------------------------- flat search agent (Search-R1, Thinker)
SEARCH_AGENT_INSTRUCTIONS = (
    "Answer the question below. Reason inside <think> and </think> every time you receive new "
    "information. When a fact is missing, search for it by writing <search> your query </search>; the best "
    "matching passages come back between <information> and </information>. You may search as often as you "
    "need. Once you know the answer, write only the answer between <answer> and </answer>, with no "
    "explanation, for example <answer> Marie Curie </answer>."
)


def question_text(question: str) -> str:
    """A question as Search-R1 feeds it: stripped, ending with a question mark."""
    question = question.strip()
    return question if question.endswith("?") else question + "?"


def search_agent_messages(question: str) -> Messages:
    """The flat agent's prompt (search-r1 policy, thinker-searcher Thinker): one user message."""
    return [{"role": "user", "content": f"{SEARCH_AGENT_INSTRUCTIONS}\n\nQuestion: {question_text(question)}\n"}]


# ---------------------------------------------------------------- naive RAG (one turn over retrieved passages)
RAG_INSTRUCTIONS = (
    "Read the passages and answer the question. Reply with the answer alone, in a few words (a name, a "
    "place, a date, a number, or yes or no), not a sentence."
)


def rag_messages(question: str, docs: Sequence[tuple[str, str]]) -> Messages:
    """Naive RAG's prompt: the passages retrieved for the question, then the question."""
    return [
        {
            "role": "user",
            "content": f"{RAG_INSTRUCTIONS}\n\n{format_documents(docs)}\nQuestion: {question_text(question)}\n",
        }
    ]


# ---------------------------------------------------------------- CoDA planner and executor
# The tag formats are shown with placeholders only, never with a concrete entity or answer: SmolLM2-135M copied
# the old examples verbatim (bench/results/qa.md, HotpotQA: 58 of 150 held-out episodes delegated the example
# task, 37 answered the example answer). tests/unit/agents/test_prompt_examples.py keeps it that way.
# A planner's <task> block holds one sub-question per line: the lines of one block run in parallel, each in its
# own executor (``agents.coda.split_tasks``). A planner turn ends at its first </task> (a stop string), so the
# lines of one block are the only way a turn can delegate more than one sub-question.
TASK_LINE_SEPARATOR = "\n"
PLANNER_SYSTEM = (
    "You answer hard questions by splitting them into simple sub-questions and settling them one at a time.\n"
    "Rules:\n"
    "1. Break the question into the smallest self-contained sub-questions.\n"
    "2. Never rely on memory for a fact: ask for it.\n"
    "3. Make the final answer answer the original question.\n"
    "Reason inside <think> and </think>. To get a fact, hand one sub-question to a helper by writing "
    "<task> one sub-question </task>; the helper's answer comes back between <result> and </result>. "
    "Sub-questions that do not depend on each other go in the same task, one per line: their helpers work at "
    "the same time and their answers come back in order, one <result> block each. "
    "A later task may build on an earlier result; ask each sub-question once. "
    "When you know the final answer, write it between <answer> and </answer>: a few words (a name, a place, "
    "a date, a number, or yes or no), not a sentence."
)

EXECUTOR_SYSTEM = (
    "You answer one question with the help of a search engine.\n"
    "Reason inside <think> and </think>. When a fact is missing, write <search> a query </search>; the "
    "matching documents come back between <documents> and </documents>. After every search, condense what "
    "the documents say about the question between <refine> and </refine>. Search again if you still lack "
    "something. Finish with the answer alone between <answer> and </answer>: a few words (a name, a place, "
    "a date, a number, or yes or no), not a sentence."
)


def planner_messages(question: str) -> Messages:
    return [
        {"role": "system", "content": PLANNER_SYSTEM},
        {"role": "user", "content": f"Question: {question_text(question)}"},
    ]


def executor_messages(task: str) -> Messages:
    """The executor's whole context: its instructions and the task, nothing of the planner's history."""
    return [{"role": "system", "content": EXECUTOR_SYSTEM}, {"role": "user", "content": f"Question: {task.strip()}"}]


# ---------------------------------------------------------------- frozen searcher (searcher service)
def searcher_messages(query: str, max_turns: int) -> Messages:
    system = (
        "You are a search assistant: answer the query by looking things up.\n"
        f"You have up to {max_turns} searches.\n"
        "Think inside <think> and </think> about what you still need, then write <search> a query </search>. "
        "Results arrive between <information> and </information>. Read them, then search again or give a "
        "short, direct answer between <answer> and </answer>. Always end with <answer> … </answer>."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Query: {query.strip()}"}]


SEARCHER_NO_ANSWER = "No sufficient information was found for this query."

# ---------------------------------------------------------------- environment messages (all masked)
INVALID_SEARCH_ACTION = (
    "\nThat was not a valid action. To look something up, put the query between <search> and </search>. "
    "To finish, put the answer between <answer> and </answer>. Try again.\n"
)
INVALID_PLANNER_ACTION = (
    "\nThat was not a valid action. To delegate, put one sub-question between <task> and </task>. "
    "To finish, put the answer between <answer> and </answer>. Try again.\n"
)
FINAL_ANSWER_NUDGE = "\nNo more actions are available. Write your final answer now between <answer> and </answer>.\n"

# How each observation is wrapped around its content: (before, after). Search-R1's <information> blocks
# sit between blank lines; CoDA's <documents> and <result> between single newlines.
OBSERVATION_WRAP: dict[str, tuple[str, str]] = {
    "information": ("\n\n<information>", "</information>\n\n"),
    "documents": ("\n<documents>", "</documents>\n"),
    "result": ("\n<result>", "</result>\n"),
    "tool_response": (f"\n{TOOL_RESPONSE_OPEN}\n", f"\n{TOOL_RESPONSE_CLOSE}\n"),
}

NO_RESULTS = "No results."


def format_documents(docs: Sequence[tuple[str, str]]) -> str:
    """Retrieved ``(title, text)`` pairs as Search-R1's clients render them: ``Doc i(Title: t) text``."""
    if not docs:
        return NO_RESULTS
    return "".join(f"Doc {i}(Title: {title}) {text}\n" for i, (title, text) in enumerate(docs, start=1))


# ---------------------------------------------------------------- recursive reasoner (JSON planner, worker)
def decomposer_prompt(problem: str) -> str:
    """Plain-text prompt (no chat template, as upstream's recursive reasoner): the planner returns one JSON object."""
    return (
        "Read this math problem and choose how to solve it.\n\n"
        f"Problem: {problem.strip()}\n\n"
        "Decide:\n"
        "1. whether it needs several separate calculations (decompose) or one (atomic);\n"
        "2. if you decompose, name 2 or 3 independent calculation steps;\n"
        "3. in one sentence, why.\n\n"
        "Answer with JSON only:\n"
        '{"should_decompose": true or false, "subproblems": ["step", ...] (empty if atomic), '
        '"plan": "one sentence"}\n'
    )


def worker_solve_prompt(problem: str, subproblem: str) -> str:
    return (
        "Work out one part of a math problem.\n\n"
        f"Whole problem: {problem.strip()}\nPart to solve: {subproblem.strip()}\n\n"
        "Solve only this part, show the arithmetic and give a number.\n"
        'Answer with JSON: {"solution": "your working", "result": <number>}\n'
    )


def worker_combine_prompt(problem: str, steps: Sequence[tuple[str, str]]) -> str:
    parts = "".join(f"Step {i}: {sub}\nResult: {sol}\n\n" for i, (sub, sol) in enumerate(steps, start=1))
    return (
        "Put these partial results together to answer the whole problem.\n\n"
        f"Whole problem: {problem.strip()}\n\nPartial results:\n{parts}"
        "Compute the final answer and show the arithmetic.\n"
        'Answer with JSON: {"final_calculation": "your working", "final_answer": <number>}\n'
    )


def worker_direct_prompt(problem: str) -> str:
    return (
        "Solve this math problem step by step.\n\n"
        f"Problem: {problem.strip()}\n\n"
        "Show the arithmetic and give the final number.\n"
        'Answer with JSON: {"solution": "your working", "final_answer": <number>}\n'
    )


# ---------------------------------------------------------------- tool agent (OpenAI tool calling, hermes)
SEARCH_TOOL: dict = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Look up passages in the document store",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "What to look for"}},
            "required": ["query"],
        },
    },
}


def tool_agent_messages(question: str) -> Messages:
    """System prompt with the tool schema written out (hermes layout), so tokenizers without a tool-aware
    chat template still show the model its tool."""
    system = (
        "You answer questions about the document store.\n"
        "Before every tool call and before your reply, plan step by step inside <think> and </think>.\n"
        "You can call this tool:\n<tools>\n" + json.dumps(SEARCH_TOOL) + "\n</tools>\n"
        f'To call it, write {TOOL_CALL_OPEN}{{"name": "search", "arguments": {{"query": "..."}}}}'
        f"{TOOL_CALL_CLOSE}. Results come back between {TOOL_RESPONSE_OPEN} and {TOOL_RESPONSE_CLOSE}. "
        "After your reasoning, reply with the answer only."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": question.strip()}]


# ---------------------------------------------------------------- tokenizers: rendering and encoding
class TokenizerLike(Protocol):
    eos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def render(self, messages: Messages) -> list[int]: ...
    def tool_turn(self, content: str, role: str = "tool") -> str: ...


def with_system(messages: Messages, system_prompt: str | None) -> Messages:
    """``messages`` with a system turn first when ``system_prompt`` is set and they have none."""
    if system_prompt is None or (messages and messages[0]["role"] == "system"):
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


def plain_render(messages: Messages) -> str:
    """Base-model layout (no chat template): system text, the user text, then ``\\nAssistant: ``."""
    parts = [m["content"] for m in messages if m["role"] in ("system", "user")]
    return "\n\n".join(parts) + "\nAssistant: "


PLAIN_TOOL_TURN = "\n<tool_response>\n{content}\n</tool_response>\n"
PLAIN_USER_TURN = "\n\nUser: {content}\nAssistant: "  # plain_render's layout, for a model with no template

# Where environment text (observations, the invalid-action message, the final-answer nudge) goes: ``inline`` in
# the assistant's own turn (Search-R1's convention), or as a separate ``user``/``tool`` turn rendered by the
# model's chat template. An instruct model reads inline text as its own words and may continue it.
ENV_TURNS = ("inline", "user", "tool")
INLINE: tuple[str, str] = ("", "")  # the frame of inline environment text: nothing around it


def plain_turn(content: str, role: str) -> str:
    return (PLAIN_USER_TURN if role == "user" else PLAIN_TOOL_TURN).format(content=content)


def env_frame(tok: TokenizerLike, env_turn: str) -> tuple[str, str]:
    """``(before, after)`` put around environment text for ``env_turn``: nothing for ``inline``; else what ends the
    assistant's turn and opens one of that role, and what closes it and opens the assistant's next turn."""
    if env_turn not in ENV_TURNS:
        raise ValueError(f"env_turn must be one of {', '.join(ENV_TURNS)}, not {env_turn!r}")
    if env_turn == "inline":
        return INLINE
    marker = "\x00"
    before, _, after = tok.tool_turn(marker, role=env_turn).partition(marker)
    return before, after


class CharTokenizer:
    """One id per Unicode character (``ord + 3``); 0 = pad, 1 = EOS. Deterministic and dependency-free."""

    pad_token_id, eos_token_id, offset = 0, 1, 3

    def encode(self, text: str) -> list[int]:
        # UTF-32 code units are the code points: one vectorised pass instead of a Python loop per character.
        return (np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64) + self.offset).tolist()

    def decode(self, ids: list[int]) -> str:
        arr = np.asarray(ids, dtype=np.int64)
        return (arr[arr >= self.offset] - self.offset).astype(np.uint32).tobytes().decode("utf-32-le")

    def render(self, messages: Messages) -> list[int]:
        return self.encode(plain_render(messages))

    def tool_turn(self, content: str, role: str = "tool") -> str:
        return plain_turn(content, role)


class HFTokenizer:
    """The served model's tokenizer (``tokenizer.json`` / ``tokenizer_config.json`` in ``path``)."""

    def __init__(self, path: str, system_prompt: str | None = None) -> None:
        """``system_prompt``: the system turn put before any prompt that has none. ``None`` leaves it to the chat
        template, and some templates add one of their own (SmolLM2's: 16 tokens naming the model), so a recipe
        says what it wants; ``""`` is an empty system turn."""
        from transformers import AutoTokenizer  # heavy import: only where a real tokenizer is needed

        self.system_prompt = system_prompt
        self.tok = AutoTokenizer.from_pretrained(path)
        self.eos_token_id = self.tok.eos_token_id
        self.has_template = bool(getattr(self.tok, "chat_template", None))
        # The Rust tokenizer directly: same ids as ``tok.encode``, without the Python wrapper's per-call cost
        # (it runs once per observation and per prompt on the rollout's hot path).
        self.fast = getattr(self.tok, "backend_tokenizer", None)
        self._rendered: dict[tuple, list[int]] = {}
        self._short: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        # Observation wrappers and environment messages repeat on every turn: cache the short strings.
        if len(text) <= 256:
            ids = self._short.get(text)
            if ids is None:
                if len(self._short) >= 4096:
                    self._short.clear()
                ids = self._short[text] = self._encode(text)
            return list(ids)
        return self._encode(text)

    def _encode(self, text: str) -> list[int]:
        if self.fast is not None:
            return self.fast.encode(text, add_special_tokens=False).ids
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        if self.fast is not None:
            return self.fast.decode(ids, skip_special_tokens=False)
        return self.tok.decode(ids, skip_special_tokens=False)

    def render(self, messages: Messages) -> list[int]:
        """Prompt ids of ``messages``; cached, since the ``n`` samples of a group share their prompt."""
        messages = with_system(messages, self.system_prompt)
        key = tuple((m["role"], m["content"]) for m in messages)
        ids = self._rendered.get(key)
        if ids is None:
            if self.has_template:
                text = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            else:
                text = plain_render(messages)
            ids = self.encode(text)
            if len(self._rendered) >= 4096:
                self._rendered.clear()
            self._rendered[key] = ids
        return list(ids)

    def tool_turn(self, content: str, role: str = "tool") -> str:
        """The text that closes an assistant turn that stopped mid-turn (at ``</tool_call>``, ``</search>``),
        holds ``content`` as a turn of ``role`` and opens the assistant's next turn, as the chat template
        renders it (plain layout without a template)."""
        if not self.has_template:
            return plain_turn(content, role)
        marker = "\x00CALL\x00"
        convo = [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}]
        text = self.tok.apply_chat_template(
            [*convo, {"role": role, "content": content}], add_generation_prompt=True, tokenize=False
        )
        cut = text.rfind(marker)
        return text[cut + len(marker) :] if cut >= 0 else plain_turn(content, role)


def load_tokenizer(spec: str, system_prompt: str | None = None) -> TokenizerLike:
    if spec == "char":
        return CharTokenizer()
    if not spec:
        raise ValueError("set the tokenizer (CODA_ROLLOUT_TOKENIZER / --tokenizer): the served model's folder")
    return HFTokenizer(spec, system_prompt)
