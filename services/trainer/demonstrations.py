"""Token ids and loss masks of make-sft's demonstrations, assembled the way a rollout builds its trajectory.

A demonstration is a list of pieces: the prompt (mask 0), each action the agent writes (mask 1), each
observation the environment answers with (mask 0), then EOS (mask 1). Observations are encoded by the turn
engine's own ``encode_observation``: the wrapper and the ``env_turn`` frame whole, the content cut at
``max_obs_tokens`` as the rollout cuts it. So a demonstration holds the ids a rollout that took the same
actions holds (tests/unit/agents/test_env_turn.py, tests/unit/trainer/test_two_hop_demos.py), and never shows
the policy more of a document than a rollout would.

- flat (search-r1, thinker): ``<search> q </search>`` → ``<information>`` per search, then ``<answer>``;
- CoDA executor: ``<search> task </search>`` → ``<documents>`` → ``<refine>`` (the retrieved sentence holding
  the answer) and ``<answer>``;
- CoDA planner: ``<task> sub-question </task>`` → ``<result>`` (its executor's answer) per delegation, then
  ``<answer>``; one task per turn, as a rollout's turn ends at the first ``</task>``.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from recipes.core.tokenizer import INLINE
from recipes.core.turns import Observation, encode_observation
from recipes.prompts import (
    OBSERVATION_WRAP,
    executor_messages,
    format_documents,
    planner_messages,
    rag_messages,
    search_agent_messages,
)

# The fixed <think> sentences (``--no-think`` leaves them out). They are part of the demonstrations' cache key.
THOUGHTS = {
    "search": "I should look this up.",
    "search again": "I need one more fact.",
    "read": "The passages give the answer.",
    "executor search": "I need to search for this.",
    "delegate": "One fact settles this; I will ask for it.",
    "delegate first": "I will ask for the first fact.",
    "delegate next": "I will ask for the next fact.",
    "conclude": "The helper found the answer.",
}


@dataclass(frozen=True)
class Style:
    """How every demonstration of a run is written: the think sentences, where observations go (the rollout's
    ``env_turn`` frame) and how many content tokens one observation keeps (the rollout's ``max_obs_tokens``;
    0: all)."""

    think: bool = True
    frame: tuple[str, str] = INLINE
    max_obs_tokens: int = 0

    def thought(self, key: str) -> str:
        return f"<think> {THOUGHTS[key]} </think>\n" if self.think else ""

    def observation(self, tok, tag: str, content: str) -> tuple[list[int], str]:
        """The ids of an observation and the content they show (cut at ``max_obs_tokens``)."""
        before, after = OBSERVATION_WRAP[tag]
        obs = Observation(content, self.frame[0] + before, after + self.frame[1], tag)
        ids, _, shown = encode_observation(tok, obs, self.max_obs_tokens or sys.maxsize)
        return ids, shown


@dataclass(frozen=True)
class Search:
    """One search and what the retriever returned for it."""

    query: str
    text: str  # the documents as an observation renders them (``format_documents``)
    passages: tuple[str, ...] = ()  # their texts, for the executor's <refine>
    titles: tuple[str, ...] = ()  # their titles, without quotes
    doc_ids: tuple[str, ...] = ()

    @classmethod
    def of(cls, query: str, docs: Sequence) -> Search:
        """From the retriever's ``RetrievedDocument`` list."""
        return cls(
            query=query.strip(),
            text=format_documents([(d.title, d.text) for d in docs]),
            passages=tuple(d.text for d in docs),
            titles=tuple(d.title.strip('"') for d in docs),
            doc_ids=tuple(d.id for d in docs),
        )

    def shown_titles(self, shown: str) -> list[str]:
        """The titles whose document header survived the cut to ``shown``."""
        return [t for t in self.titles if f'(Title: "{t}")' in shown or f"(Title: {t})" in shown]


def _assemble(tok, pieces: list[tuple[list[int], int]]) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    mask: list[int] = []
    for part, m in pieces:
        ids += part
        mask += [m] * len(part)
    if tok.eos_token_id is not None:
        ids.append(tok.eos_token_id)
        mask.append(1)
    return ids, mask


def search_demonstration(
    tok, question: str, searches: Sequence[Search], gold: str, style: Style = Style()
) -> tuple[list[int], list[int]]:
    """The flat agent: each search and its ``<information>``, in order, then the answer."""
    pieces = [(tok.render(search_agent_messages(question)), 0)]
    for n, search in enumerate(searches):
        thought = style.thought("search" if n == 0 else "search again")
        pieces.append((tok.encode(f"{thought}<search> {search.query} </search>"), 1))
        pieces.append((style.observation(tok, "information", search.text)[0], 0))
    pieces.append((tok.encode(f"{style.thought('read')}<answer> {gold} </answer>"), 1))
    return _assemble(tok, pieces)


def demonstration(
    tok, question: str, gold: str, docs_text: str, think: bool = True, frame: tuple[str, str] = INLINE
) -> tuple[list[int], list[int]]:
    """The one-search flat demonstration: the question searched verbatim, its documents, the answer."""
    return search_demonstration(tok, question, [Search(question.strip(), docs_text)], gold, Style(think, frame))


def evidence(passages: Sequence[str], answer: str, shown: str | None = None) -> str:
    """The retrieved sentence that contains the answer (else the first one), among those ``shown``."""
    sentences = [x.strip() for p in passages for x in re.split(r"(?<=[.!?])\s+|\n", p) if x.strip()]
    sentences = [x for x in sentences if shown is None or x in shown] or sentences
    for sentence in sentences:
        if answer.lower() in sentence.lower():
            return sentence
    return sentences[0] if sentences else ""


def executor_demonstration(
    tok, task: str, search: Search, answer: str, style: Style = Style()
) -> tuple[list[int], list[int]]:
    """A CoDA executor: one search for its task, the sentence that answers it, the answer."""
    ids, shown = style.observation(tok, "documents", search.text)
    refine = evidence(search.passages, answer, shown)
    return _assemble(
        tok,
        [
            (tok.render(executor_messages(task)), 0),
            (tok.encode(f"{style.thought('executor search')}<search> {search.query} </search>"), 1),
            (ids, 0),
            (tok.encode(f"<refine> {refine} </refine>\n<answer> {answer} </answer>"), 1),
        ],
    )


def planner_demonstration(
    tok, question: str, delegations: Sequence[tuple[str, str]], gold: str, style: Style = Style()
) -> tuple[list[int], list[int]]:
    """A CoDA planner: each ``(task, its executor's answer)`` in its own turn, then the answer."""
    pieces = [(tok.render(planner_messages(question)), 0)]
    for n, (task, result) in enumerate(delegations):
        key = "delegate" if len(delegations) == 1 else "delegate first" if n == 0 else "delegate next"
        pieces.append((tok.encode(f"{style.thought(key)}<task> {task} </task>"), 1))
        pieces.append((style.observation(tok, "result", result)[0], 0))
    pieces.append((tok.encode(f"{style.thought('conclude')}<answer> {gold} </answer>"), 1))
    return _assemble(tok, pieces)


def rag_demonstration(tok, question: str, docs: Sequence[tuple[str, str]], gold: str) -> tuple[list[int], list[int]]:
    """Naive RAG in one turn (``recipes.naive_rag``): the question's passages and the question, then the answer
    alone, as its instructions ask (no tags, no search action)."""
    return _assemble(tok, [(tok.render(rag_messages(question, docs)), 0), (tok.encode(gold), 1)])


def prompt_fingerprint(fmt: str) -> str:
    """Every text of ours that a demonstration of ``fmt`` (search, coda, rag) holds besides the data: the prompts as
    the agents render them, the observation wrappers, the document layout and the think sentences. Part of the
    demonstrations' cache key (``services.stack.prepare.Layout.for_run``): after a prompt edit the cached
    demonstrations, which show the old prompt, are made again instead of trained on."""
    messages = (
        planner_messages("{question}") + executor_messages("{task}")
        if fmt == "coda"
        else rag_messages("{question}", [("{title}", "{text}")])
        if fmt == "rag"
        else search_agent_messages("{question}")
    )
    texts = {
        "messages": messages,
        "wrappers": OBSERVATION_WRAP,
        "documents": format_documents([("{title}", "{text}")]),
        "thoughts": THOUGHTS,
    }
    return json.dumps(texts, sort_keys=True)
