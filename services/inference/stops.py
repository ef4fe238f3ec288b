"""When a sequence stops, and why, with vLLM's ``finish_reason`` / ``stop_reason`` semantics.

* EOS (unless ``ignore_eos``): ``finish_reason="stop"``, ``stop_reason=None``; the EOS id stays in the ids.
* a ``stop_token_ids`` id: ``"stop"``, ``stop_reason=<that id>``; the id stays in the ids.
* a stop string appearing in the decoded text: ``"stop"``, ``stop_reason=<the string>``; the token that
  completed it stays in the ids, the text is cut before the string (or after it with
  ``include_stop_str_in_output``).
* ``max_tokens`` generated (or the context is full): ``"length"``, ``stop_reason=None``.
Nothing but ``max_tokens`` ends a sequence before ``min_tokens`` tokens exist.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finish:
    reason: str  # "stop" | "length" | "abort" (the caller went away)
    stop_reason: int | str | None = None
    text_end: int | None = None  # cut the text here (stop strings)


def find_stop_string(text: str, stops: tuple[str, ...], new_from: int) -> tuple[str, int] | None:
    """The stop string that occurs first in ``text``, looking only at matches that end after ``new_from``.

    Returns ``(stop, start index)``; earlier text was already checked on previous steps.
    """
    best: tuple[str, int] | None = None
    for stop in stops:
        if not stop:
            continue
        index = text.find(stop, max(0, new_from - len(stop) + 1))
        if index >= 0 and (best is None or index < best[1]):
            best = (stop, index)
    return best


def check_token(
    token: int,
    num_generated: int,
    *,
    eos_ids: frozenset[int],
    stop_token_ids: frozenset[int],
    ignore_eos: bool,
    min_tokens: int,
) -> Finish | None:
    """A finish caused by the newest token id alone (EOS or a stop token)."""
    if num_generated < min_tokens:
        return None
    if token in stop_token_ids:
        return Finish("stop", token)
    if not ignore_eos and token in eos_ids:
        return Finish("stop", None)
    return None


def check_text(
    text: str, new_from: int, stops: tuple[str, ...], include_stop: bool, num_generated: int, min_tokens: int
) -> Finish | None:
    """A finish caused by a stop string in the decoded text."""
    if not stops or num_generated < min_tokens:
        return None
    found = find_stop_string(text, stops, new_from)
    if found is None:
        return None
    stop, index = found
    return Finish("stop", stop, index + len(stop) if include_stop else index)
