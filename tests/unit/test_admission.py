"""The admission rule by hand (``shared.stream``): how many groups the rollout may start, by version and
by the trainer's mark of groups taken."""

from __future__ import annotations

import pytest

from shared.stream import admission_capacity, admission_limit


@pytest.mark.parametrize(
    ("s", "v", "g", "accepted", "running", "expected"),
    [
        (0, 0, 4, 0, 0, 4),  # on-policy, fresh: one step's worth
        (0, 0, 4, 3, 1, 0),  # ... all taken
        (1, 0, 4, 0, 0, 8),  # one version of slack doubles it
        (1, 2, 4, 10, 1, 5),  # (1+2+1)*4 - 11
        (2, 5, 3, 30, 0, -6),  # over-produced before a restart: negative means none
    ],
)
def test_capacity_by_hand(s, v, g, accepted, running, expected):
    assert admission_capacity(s, v, g, accepted, running) == expected


@pytest.mark.parametrize(
    ("s", "v", "g", "consumed", "accepted", "running", "expected"),
    [
        (1, 2, 4, 8, 10, 1, 5),  # consumed = v·g: the same as the version formula
        (1, 5, 4, 8, 10, 1, 5),  # versions ran ahead of consumption (a restart): no extra groups released
        (0, 3, 2, 7, 7, 0, 2),  # 7 taken (one foreign group among them): one step's worth more
        (1, 0, 4, -2, 0, 0, 6),  # two foreign groups wait undelivered: the rollout waits for them
    ],
)
def test_capacity_follows_groups_consumed(s, v, g, consumed, accepted, running, expected):
    assert admission_capacity(s, v, g, accepted, running, consumed=consumed) == expected


def test_limit_without_a_mark_is_the_version_count():
    assert admission_limit(1, 3, 4) == admission_limit(1, 3, 4, consumed=12) == 20  # 3·4 + 2·4
