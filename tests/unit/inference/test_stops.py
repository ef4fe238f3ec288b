"""Stop conditions with vLLM's finish_reason / stop_reason semantics."""

from __future__ import annotations

from services.inference.stops import Finish, check_text, check_token, find_stop_string

EOS = frozenset({2})


def test_find_stop_string_earliest_and_only_new_text():
    assert find_stop_string("a</search>b</answer>", ("</answer>", "</search>"), 0) == ("</search>", 1)
    assert find_stop_string("x</search>", ("</search>",), 5) == ("</search>", 1)  # match ends in new text
    assert find_stop_string("x</search> tail", ("</search>",), 12) is None  # seen on an earlier step
    assert find_stop_string("abc", ("",), 0) is None


def test_check_text_cuts_before_or_after():
    assert check_text("hi</search>", 0, ("</search>",), False, 3, 0) == Finish("stop", "</search>", 2)
    assert check_text("hi</search>", 0, ("</search>",), True, 3, 0) == Finish("stop", "</search>", 11)
    assert check_text("hi</search>", 0, ("</search>",), True, 3, 5) is None  # min_tokens not reached


def test_check_token_eos_and_stop_ids():
    kw = dict(eos_ids=EOS, stop_token_ids=frozenset({7}), ignore_eos=False, min_tokens=0)
    assert check_token(2, 1, **kw) == Finish("stop", None)
    assert check_token(7, 1, **kw) == Finish("stop", 7)
    assert check_token(5, 1, **kw) is None
    assert check_token(2, 1, **{**kw, "ignore_eos": True}) is None
    assert check_token(2, 1, **{**kw, "min_tokens": 2}) is None
