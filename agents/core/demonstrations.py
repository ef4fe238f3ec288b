"""What every agent's demonstration format shares: token ids and loss masks assembled the way a rollout builds its
trajectory, and the ``DemoFormat`` entry an agent module gives make-sft (``Agent.demonstrations``).

A demonstration is a list of pieces: the prompt (mask 0), each action the agent writes (mask 1), each
observation the environment answers with (mask 0), then EOS (mask 1). Observations are encoded by the turn
engine's own ``encode_observation``: the wrapper and the ``env_turn`` frame whole, the content cut at
``max_obs_tokens`` as the rollout cuts it. So a demonstration holds the ids a rollout that took the same
actions holds (tests/unit/agents/test_env_turn.py, tests/unit/trainer/test_two_hop_demos.py), and never shows
the policy more of a document than a rollout would.

The formats themselves (which actions, in which order, for which rows) live in their agents' modules
(``agents.search_r1``, ``agents.coda``, ``agents.naive_rag``); make-sft (``tools.make_sft``) reads
the rows, retrieves once for every query a format asks for, calls the format per row and writes the file.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agents.answers import as_gold_list, normalize_answer
from agents.core.turns import Observation, encode_observation
from agents.prompts import INLINE, OBSERVATION_WRAP, Messages, format_documents

if TYPE_CHECKING:
    from agents.plans import HopPlan

Demo = tuple[list[int], list[int]]  # token ids and loss mask


@dataclass(frozen=True)
class Style:
    """How every demonstration of a run is written: the fixed think sentences or none, where observations go
    (the rollout's ``env_turn`` frame) and how many content tokens one observation keeps (the rollout's
    ``max_obs_tokens``; 0: all)."""

    think: bool = True
    frame: tuple[str, str] = INLINE
    max_obs_tokens: int = 0

    def thought(self, sentence: str) -> str:
        return f"<think> {sentence} </think>\n" if self.think else ""

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


@dataclass(frozen=True)
class Writer:
    """What every demonstration of one make-sft run shares: the tokenizer, the style, and whether a question
    whose retrieved text does not back its answer is kept anyway."""

    tok: Any
    style: Style = Style()
    keep_unsupported: bool = False

    def question_search(self, q: Question, whole: bool = False) -> Search | None:
        """The question searched verbatim, when what the demonstration shows of its documents (``whole``: all of
        them; else the observation as the rollout cuts it) backs a gold answer, or ``keep_unsupported``; else
        None."""
        search = q.search(q.text)
        shown = search.text if whole else self.style.observation(self.tok, "information", search.text)[1]
        if self.keep_unsupported or supported(shown, q.golds, search.shown_titles(shown), q.supporting):
            return search
        return None


@dataclass(frozen=True)
class Question:
    """One QA row to demonstrate: the row, its hop plan (``--hops supporting``; None: none) and what the
    retriever returned for every query of the run."""

    row: dict
    plan: HopPlan | None
    found: Mapping[str, Sequence]

    @property
    def text(self) -> str:
        return self.row["question"]

    @property
    def golds(self) -> list[str]:
        return as_gold_list(self.row["golden_answers"])

    @property
    def supporting(self) -> list[str]:
        return (self.row.get("metadata") or {}).get("supporting_titles", [])

    def search(self, query: str) -> Search:
        return Search.of(query, self.found[query])

    def record(self, role: str, demo: Demo, answer: str, searches: Sequence[Search]) -> dict:
        """One line of make-sft's file: a demonstration of this row."""
        ids, mask = demo
        return {
            "id": self.row.get("id"),
            "role": role,
            "token_ids": ids,
            "loss_mask": mask,
            "doc_ids": [i for s in searches for i in s.doc_ids],
            "queries": [s.query for s in searches],
            "answer": answer,
        }


@dataclass(frozen=True)
class Written:
    """A row's demonstration records and what make-sft's coverage table counts for it (``planned``, ``kept``,
    ``dropped``, ``restating``, ``unsupported``)."""

    records: list[dict]
    counts: tuple[str, ...]


def _no_hops(plan: HopPlan) -> Sequence[str]:
    return ()


@dataclass(frozen=True)
class DemoFormat:
    """An agent's demonstration format, as its module defines it and make-sft calls it."""

    name: str  # make-sft's --format (search, coda, rag); agents of one format share its cached demonstrations
    write: Callable[[Writer, Question], Written]  # one row's demonstrations
    prompts: Callable[[], Messages]  # its prompts with placeholders for the data (the cache key holds them)
    thoughts: Mapping[str, str] = field(default_factory=dict)  # its fixed <think> sentences
    hop_queries: Callable[[HopPlan], Sequence[str]] = _no_hops  # the searches a row's hop plan adds

    def fingerprint(self) -> str:
        """Every text of ours that its demonstrations hold besides the data: the prompts as the agent renders
        them, the observation wrappers, the document layout and the think sentences. Part of the
        demonstrations' cache key (``launcher.prepare.Layout.for_run``): after a prompt edit the cached
        demonstrations, which show the old prompt, are made again instead of trained on."""
        texts = {
            "messages": self.prompts(),
            "wrappers": OBSERVATION_WRAP,
            "documents": format_documents([("{title}", "{text}")]),
            "thoughts": dict(self.thoughts),
        }
        return json.dumps(texts, sort_keys=True)


def assemble(tok, pieces: list[tuple[list[int], int]]) -> Demo:
    """The pieces' ids, each with its mask, then EOS (trained: the demonstration teaches where to stop)."""
    ids: list[int] = []
    mask: list[int] = []
    for part, m in pieces:
        ids += part
        mask += [m] * len(part)
    if tok.eos_token_id is not None:
        ids.append(tok.eos_token_id)
        mask.append(1)
    return ids, mask


def supported(docs_text: str, golds: list[str], titles: list[str], supporting: list[str]) -> bool:
    """True when the retrieved documents back the gold answer: the answer occurs in them, or for a yes/no
    question, a supporting title was retrieved. So a demonstration never answers from nowhere."""
    text = f" {normalize_answer(docs_text)} "
    if any(normalize_answer(g) in ("yes", "no") for g in golds):
        return bool(set(titles) & set(supporting))
    return any(f" {normalize_answer(g)} " in text for g in golds if normalize_answer(g))
