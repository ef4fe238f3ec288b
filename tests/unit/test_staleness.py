"""The staleness rule by hand: lags and the trainer's cut-off (admission: tests/unit/test_admission.py)."""

from __future__ import annotations

import pytest

from shared.stream import (
    group_staleness,
    sample_staleness,
    staleness,
    token_staleness,
    too_stale,
)
from tests.factories import make_group, make_sample


def _sample(sample_id: str, generated_versions: list[int]):
    s = make_sample(sample_id, prompt=3, generated=len(generated_versions))
    s.versions = [-1] * 3 + generated_versions  # prompt tokens carry no version and are not trained
    return s


@pytest.mark.parametrize(
    ("sampled", "live", "expected"),
    [(2, 5, 3), (5, 5, 0), (6, 5, 0), (None, 5, 0), (0, 0, 0)],  # newer than the reader's view: fresh, not < 0
)
def test_staleness_by_hand(sampled, live, expected):
    assert staleness(sampled, live) == expected


@pytest.mark.parametrize(("lag", "s", "expected"), [(0, 0, False), (1, 0, True), (1, 1, False), (2, 1, True)])
def test_too_stale_is_beyond_max_staleness(lag, s, expected):
    assert too_stale(lag, s) is expected


def test_a_sample_is_as_stale_as_its_oldest_trained_token():
    s = _sample("a", [2, 3, 4, 4])
    assert sample_staleness(s, 5) == 3
    assert sample_staleness(s, 1) == 0
    assert token_staleness(s, 4) == [0.0, 0.0, 0.0, 2.0, 1.0, 0.0, 0.0]  # the prompt's -1 counts for nothing
    untrained = make_sample("u", generated=0)
    assert sample_staleness(untrained, 9) == 0 and token_staleness(untrained, 9) == [0.0, 0.0, 0.0]


def test_a_group_is_as_stale_as_its_oldest_sample():
    g = make_group(n=2)
    g.samples = [_sample("a", [4, 4]), _sample("b", [2, 3])]
    assert group_staleness(g, 5) == 3
    assert group_staleness(g, 1) == 0
    g.samples = [make_sample("u", generated=0)]
    assert group_staleness(g, 7) == 0
