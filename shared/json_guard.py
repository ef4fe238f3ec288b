"""Cheap checks of a raw JSON request body before anything parses it: UTF-8, nesting depth, lone surrogates.

Why on the raw bytes: Python's ``json`` accepts what the rest of a service cannot handle. A string holding a
lone UTF-16 surrogate (``"\\ud800"``) parses, passes validation, and then fails wherever the text is
encoded (tokenizer, response body) with a 500. Nesting is only bounded by the interpreter's recursion
limit, and every recursive step after the parser (validation, error formatting) pays for it again. Both
are visible in the bytes, so one scan here covers every route of every service instead of each model.

Every scan is linear in the body and runs in C (``bytes`` methods, two regexes without repetition that
could backtrack, numpy), about 0.1-0.4 s for 50 MB; bodies that cannot hold the problem (no ``\\uD8``-style
escape, fewer brackets than the depth limit) take fast paths, which is nearly every real request.
"""

from __future__ import annotations

import re

import numpy as np

# Escaped backslashes, then escaped quotes: once both are gone every ``"`` left opens or closes a string and
# every backslash left starts an escape. ``bytes.replace`` pairs a run of backslashes left to right, as JSON.
_ESCAPED_BACKSLASH, _ESCAPED_QUOTE = b"\\\\", b'\\"'
# What nesting depends on; every other byte is deleted before counting.
_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b'"[]{}')
# Then openers become +1, closers -1 and quotes 0 as int8, so numpy reads the steps without a copy.
_TO_STEPS = bytes.maketrans(b'[{]}"', b"\x01\x01\xff\xff\x00")
_CHUNK = 1 << 20  # prefix sums a chunk at a time: a few MB of scratch however large the body

# Any escape of a UTF-16 surrogate (\uD800-\uDFFF), paired or not: absent from nearly every body.
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_PAIR = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def body_problem(body: bytes, max_depth: int) -> str | None:
    """Why ``body`` must be refused with a 400 before parsing, or None when it may go on to the parser."""
    if not body.isascii():
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"request body is not valid UTF-8 ({exc.reason} at byte {exc.start})"
    if nesting_depth(body, stop_above=max_depth) > max_depth:
        return f"JSON body is nested deeper than {max_depth} levels"
    if has_lone_surrogate(body):
        return (
            "undecodable text: a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without "
            "its pair), which is not a character"
        )
    return None


def nesting_depth(body: bytes, stop_above: int | None = None) -> int:
    """The deepest array/object nesting in ``body`` (brackets inside strings do not count).

    With ``stop_above``, counting may stop as soon as the depth is known to exceed it (the answer is then
    some depth above ``stop_above``, not necessarily the deepest).
    """
    if stop_above is not None and body.count(b"[") + body.count(b"{") <= stop_above:
        return 0  # cannot be deeper than the number of openers: skip the scan
    skeleton = body.replace(_ESCAPED_BACKSLASH, b"").replace(_ESCAPED_QUOTE, b"").translate(None, _NOT_STRUCTURAL)
    steps = np.frombuffer(skeleton.translate(_TO_STEPS), dtype=np.int8)
    chars = np.frombuffer(skeleton, dtype=np.uint8) if b'"' in skeleton else None
    depth = deepest = quotes = 0
    for start in range(0, len(steps), _CHUNK):
        chunk = steps[start : start + _CHUNK]
        if chars is not None:  # a bracket after an odd number of quotes is inside a string
            seen = np.cumsum(chars[start : start + _CHUNK] == ord('"'), dtype=np.int32) + quotes
            chunk = np.where(seen & 1, 0, chunk)
            quotes = int(seen[-1]) & 1
        running = np.cumsum(chunk, dtype=np.int32)
        deepest, depth = max(deepest, depth + int(running.max())), depth + int(running[-1])
        if stop_above is not None and deepest > stop_above:
            break
    return deepest


def has_lone_surrogate(body: bytes) -> bool:
    """Whether a ``\\uXXXX`` escape in ``body`` is a surrogate without its partner.

    A high surrogate followed by a low one is one character (an emoji, say) and is fine. With escaped
    backslashes gone (``"\\\\ud800"`` is the text ``\\ud800``, not an escape) and valid pairs removed, any
    surrogate escape left is a lone one.
    """
    if _SURROGATE.search(body) is None:
        return False
    return _SURROGATE.search(_PAIR.sub(b"", body.replace(_ESCAPED_BACKSLASH, b""))) is not None
