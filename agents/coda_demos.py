"""CoDA's demonstrations, one builder a role: an executor that searches once for its task, reads the sentence
that answers it and answers; a planner that delegates its plan's tasks turn by turn and answers. Which rows get
which (``write_demonstrations``, the format make-sft calls) stays in ``agents.coda``."""

from __future__ import annotations

import re
from collections.abc import Sequence

from agents.core.demonstrations import Demo, Search, Style, assemble
from agents.prompts import OBSERVATION_WRAP, TASK_LINE_SEPARATOR, executor_messages, planner_messages

THOUGHTS = {
    "executor search": "I need to search for this.",
    "delegate": "One fact settles this; I will ask for it.",
    "delegate first": "I will ask for the first fact.",
    "delegate next": "I will ask for the next fact.",
    "delegate together": "These facts do not depend on each other; I will ask for them together.",
    "conclude": "The helper found the answer.",
}


def evidence(passages: Sequence[str], answer: str, shown: str | None = None) -> str:
    """The retrieved sentence that contains the answer (else the first one), among those ``shown``."""
    sentences = [x.strip() for p in passages for x in re.split(r"(?<=[.!?])\s+|\n", p) if x.strip()]
    sentences = [x for x in sentences if shown is None or x in shown] or sentences
    for sentence in sentences:
        if answer.lower() in sentence.lower():
            return sentence
    return sentences[0] if sentences else ""


def executor_demonstration(tok, task: str, search: Search, answer: str, style: Style = Style()) -> Demo:
    """A CoDA executor: one search for its task, the sentence that answers it, the answer."""
    ids, shown = style.observation(tok, "documents", search.text)
    refine = evidence(search.passages, answer, shown)
    return assemble(
        tok,
        [
            (tok.render(executor_messages(task)), 0),
            (tok.encode(f"{style.thought(THOUGHTS['executor search'])}<search> {search.query} </search>"), 1),
            (ids, 0),
            (tok.encode(f"<refine> {refine} </refine>\n<answer> {answer} </answer>"), 1),
        ],
    )


def planner_demonstration(
    tok, question: str, turns: Sequence[Sequence[tuple[str, str]]], gold: str, style: Style = Style()
) -> Demo:
    """A CoDA planner: each turn's ``(task, its executor's answer)`` pairs in one ``<task>`` block, one task per line
    (a rollout's turn ends at the first ``</task>``; ``split_tasks`` reads the lines back), its results as the
    rollout returns them (one ``<result>`` block per task, in order), then the answer."""
    pieces = [(tok.render(planner_messages(question)), 0)]
    before, after = OBSERVATION_WRAP["result"]
    for n, turn in enumerate(turns):
        if len(turn) > 1:
            key = "delegate together"
        else:
            key = "delegate" if len(turns) == 1 else "delegate first" if n == 0 else "delegate next"
        block = TASK_LINE_SEPARATOR.join(task for task, _ in turn)
        pieces.append((tok.encode(f"{style.thought(THOUGHTS[key])}<task> {block} </task>"), 1))
        pieces.append((style.observation(tok, "result", (after + before).join(r for _, r in turn))[0], 0))
    pieces.append((tok.encode(f"{style.thought(THOUGHTS['conclude'])}<answer> {gold} </answer>"), 1))
    return assemble(tok, pieces)
