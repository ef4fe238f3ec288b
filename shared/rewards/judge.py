"""LLM-judge reward: ask an OpenAI-compatible chat endpoint to grade an answer, parse ``[[Score: X]]``.

The HTTP client is passed in (pooled by the caller). Transport failures get bounded retries
(``shared.retry``); an unparseable verdict is re-asked at most ``parse_retries`` times. Whatever happens, the
judge returns a score: a parse failure gives ``parse_failure_score``, an HTTP/transport error
``error_score``, and both are counted in ``JudgeStats`` — a flaky judge must never crash a rollout.
Scores are divided by ``max_score`` and clipped to [0, 1], so they can stand in for F1 (e.g. in
``coda_reward(answer_score=...)``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import httpx

from shared.log import get_logger
from shared.retry import RetryPolicy, arequest
from shared.rewards.result import RewardResult

log = get_logger(__name__)

_SCORE = re.compile(r"\[\[\s*Score:\s*(-?\d+(?:\.\d+)?)\s*\]\]", re.IGNORECASE)

JUDGE_SYSTEM = (
    "You grade answers to questions. Compare the candidate answer with the reference answers and judge "
    "whether it is correct and supported by sound reasoning. Give a score from 0 to 10: 10 means correct, "
    "concise and well reasoned; 5 means partly correct; 0 means wrong or missing. A wrong final answer "
    "scores at most 3 however good the reasoning. Explain briefly, then end with the score written exactly "
    "as [[Score: X]]."
)


@dataclass(frozen=True)
class JudgeConfig:
    """Where the judge lives and how it is asked. ``base_url`` ends before ``/chat/completions``."""

    base_url: str
    model: str
    temperature: float = 0.1
    max_tokens: int = 512
    timeout_s: float = 30.0
    max_score: float = 10.0
    parse_failure_score: float = 0.1
    error_score: float = 0.0
    parse_retries: int = 1
    retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(attempts=3))


@dataclass
class JudgeStats:
    """Counters for metrics: calls made, verdicts that did not parse, calls that failed outright."""

    calls: int = 0
    parse_failures: int = 0
    errors: int = 0


def parse_judge_score(text: str, max_score: float = 10.0) -> float | None:
    """The last ``[[Score: X]]`` in ``text`` as ``clip(X / max_score, 0, 1)``, or None when there is none."""
    matches = _SCORE.findall(text or "")
    if not matches:
        return None
    return min(max(float(matches[-1]) / max_score, 0.0), 1.0)


def judge_messages(question: str, golds: Iterable[str], answer: str) -> list[dict[str, str]]:
    """The chat sent to the judge."""
    references = "\n".join(f"- {g}" for g in golds) or "- (none given)"
    user = f"Question:\n{question}\n\nReference answers:\n{references}\n\nCandidate answer:\n{answer}"
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


async def _ask(client: httpx.AsyncClient, cfg: JudgeConfig, messages: list[dict[str, str]]) -> str:
    body = {"model": cfg.model, "messages": messages, "temperature": cfg.temperature,
            "max_tokens": cfg.max_tokens}
    response = await arequest(client, "POST", f"{cfg.base_url.rstrip('/')}/chat/completions", json=body,
                              timeout=cfg.timeout_s, policy=cfg.retry)
    return response.json()["choices"][0]["message"]["content"] or ""


async def judge_score(client: httpx.AsyncClient, cfg: JudgeConfig, question: str, golds: Iterable[str],
                      answer: str, stats: JudgeStats | None = None) -> RewardResult:
    """Judge ``answer``: reward in [0, 1] and components ``judge``, ``judge_parse_failed``, ``judge_error``.

    Never raises for judge-side failures (HTTP errors, timeouts, malformed JSON, missing score).
    """
    stats = stats if stats is not None else JudgeStats()
    messages = judge_messages(question, list(golds), answer)
    for _ in range(cfg.parse_retries + 1):
        stats.calls += 1
        try:
            text = await _ask(client, cfg, messages)
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            stats.errors += 1
            log.warning("judge call failed; using the error score", extra={"error": repr(exc)})
            return RewardResult(cfg.error_score, {"judge": cfg.error_score, "judge_parse_failed": 0.0,
                                                  "judge_error": 1.0})
        score = parse_judge_score(text, cfg.max_score)
        if score is not None:
            return RewardResult(score, {"judge": score, "judge_parse_failed": 0.0, "judge_error": 0.0})
    stats.parse_failures += 1
    log.warning("judge verdict had no [[Score: X]]; using the parse-failure score")
    return RewardResult(cfg.parse_failure_score, {"judge": cfg.parse_failure_score, "judge_parse_failed": 1.0,
                                                  "judge_error": 0.0})
