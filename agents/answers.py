"""Answer normalisation and matching, defined once: rewards, eval and data prep all import it.

SQuAD-style normalisation (lowercase → drop punctuation → drop articles → collapse whitespace), then the
match functions Search-R1 and CoDA use, each taking one prediction and a list of gold answers (max over golds):

- ``exact_match``: normalised equality.
- ``sub_exact_match``: a normalised gold is a *character* substring of the normalised prediction
  (Search-R1 ``subem_check``; CoDA calls the same thing ``cover_em_check``).
- ``cover_exact_match``: the gold's normalised *tokens* appear as a contiguous run of the prediction's
  tokens. Stricter than sub-EM at word boundaries ("1" does not cover "1990", "art" not "party").
- ``token_f1``: SQuAD token F1 with the yes/no/noanswer rule.
- ``numeric_match``: the last number of the prediction equals the gold within a tolerance.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable
from typing import Literal

from agents.core.episode import RewardResult

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# Answers for which partial token overlap means nothing: "yes" vs "no" share no tokens, but "no answer"
# style golds must match exactly or not at all.
YES_NO_NOANSWER = frozenset({"yes", "no", "noanswer"})
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_GSM8K_TARGET = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, remove ``string.punctuation``, remove a/an/the, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def as_gold_list(golds: str | Iterable[str]) -> list[str]:
    """Accept one gold string or many; a bare string is one answer, not a list of characters."""
    return [golds] if isinstance(golds, str) else [str(g) for g in golds]


def exact_match(prediction: str, golds: str | Iterable[str]) -> float:
    """1.0 if ``normalize(prediction) == normalize(g)`` for some gold g, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in as_gold_list(golds)))


def sub_exact_match(prediction: str, golds: str | Iterable[str]) -> float:
    """1.0 if some non-empty ``normalize(g)`` is a substring of ``normalize(prediction)``, else 0.0.

    Empty golds (all punctuation/articles) are skipped: ``"" in s`` is always true and would reward anything.
    """
    pred = normalize_answer(prediction)
    return float(any(g and g in pred for g in map(normalize_answer, as_gold_list(golds))))


def cover_exact_match(prediction: str, golds: str | Iterable[str]) -> float:
    """1.0 if the tokens of some non-empty normalised gold occur as a contiguous run in the prediction's tokens.

    Equivalent to ``f" {g} " in f" {pred} "`` on normalised strings: a substring match on word boundaries.
    """
    pred = f" {normalize_answer(prediction)} "
    return float(any(g and f" {g} " in pred for g in map(normalize_answer, as_gold_list(golds))))


def _f1_one(pred: str, gold: str) -> float:
    """Token F1 of two normalised strings: P = same/|pred|, R = same/|gold|, F1 = 2PR/(P+R); 0 on no overlap."""
    if (pred in YES_NO_NOANSWER or gold in YES_NO_NOANSWER) and pred != gold:
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, golds: str | Iterable[str]) -> float:
    """SQuAD token F1, max over golds.

    Per gold, after normalising both sides: if either side is one of yes/no/noanswer and they differ, F1 is 0
    (so "no" vs "no way" does not get partial credit); otherwise token multiset overlap ``same`` gives
    ``P = same/|pred|``, ``R = same/|gold|``, ``F1 = 2PR/(P+R)`` (0 when ``same`` is 0).
    """
    pred = normalize_answer(prediction)
    return max((_f1_one(pred, normalize_answer(g)) for g in as_gold_list(golds)), default=0.0)


def answer_scores(prediction: str | None, golds: str | Iterable[str]) -> dict[str, float]:
    """All four match scores at once: ``{"em", "sub_em", "cover_em", "f1"}``; all 0.0 if there is no answer."""
    if prediction is None:
        return {"em": 0.0, "sub_em": 0.0, "cover_em": 0.0, "f1": 0.0}
    golds = as_gold_list(golds)
    return {
        "em": exact_match(prediction, golds),
        "sub_em": sub_exact_match(prediction, golds),
        "cover_em": cover_exact_match(prediction, golds),
        "f1": token_f1(prediction, golds),
    }


def extract_tag(text: str, tag: str = "answer", min_matches: int = 1) -> str | None:
    """The stripped content of the LAST ``<tag>…</tag>`` in ``text`` (DOTALL), or None.

    ``min_matches`` exists for texts that include a prompt with an example answer (Search-R1 scored
    prompt+response and so needed two matches); we score the response only, so the default is 1.
    """
    matches = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
    return matches[-1].strip() if len(matches) >= max(min_matches, 1) else None


def extract_all_tags(text: str, tag: str) -> list[str]:
    """The contents (unstripped) of every ``<tag>…</tag>`` in ``text``, in order."""
    return re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)


def extract_answer(text: str) -> str | None:
    """The last ``<answer>`` of a text (see ``extract_tag``).

    Rewards and eval do not use it: they score ``Episode.answer``, parsed from the policy's own turn. A whole
    response also holds the environment's messages, which spell out ``<answer> and </answer>``.
    """
    return extract_tag(text, "answer")


def parse_number(text: str) -> float | None:
    """The last number in ``text`` (commas removed: "1,234.5" → 1234.5), or None if there is none."""
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    try:
        return float(matches[-1].replace(",", ""))
    except ValueError:
        return None


def gsm8k_target(solution: str) -> float | None:
    """GSM8K gold: the number after ``####`` (commas removed), else the last number of the solution."""
    m = _GSM8K_TARGET.search(solution)
    return float(m.group(1).replace(",", "")) if m else parse_number(solution)


def numeric_match(prediction: str | float | None, gold: str | float, tol: float = 0.01) -> float:
    """1.0 if ``|x(pred) − x(gold)| < tol`` where x parses the last number of a string, else 0.0."""
    pred = prediction if isinstance(prediction, (int, float)) else parse_number(prediction or "")
    target = gold if isinstance(gold, (int, float)) else parse_number(gold)
    if pred is None or target is None:
        return 0.0
    return float(abs(float(pred) - float(target)) < tol)


AnswerMetric = Literal["em", "sub_em", "cover_em", "f1"]


def affine_answer_reward(score: float, scale: float = 6.0, shift: float = -3.0) -> float:
    """``scale·score + shift``; CoDA's ``6·F1 − 3`` maps F1 ∈ [0, 1] onto [−3, 3] (F1 = 0.5 ↦ 0)."""
    return scale * score + shift


def answer_reward(answer: str | None, golds: str | Iterable[str], metric: AnswerMetric = "em") -> RewardResult:
    """Score the episode's ``answer`` with ``metric`` (max over golds); 0 when there is none (``None``).

    Components: ``em``, ``sub_em``, ``cover_em``, ``f1`` (all logged whatever the metric) and ``has_answer``.
    """
    scores = answer_scores(answer, golds)
    components = {**scores, "has_answer": float(answer is not None)}
    return RewardResult(reward=scores[metric], components=components)
