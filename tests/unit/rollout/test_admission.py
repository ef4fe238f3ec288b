"""Admission control: the capacity formula by hand, and the gate's waiting behaviour."""

from __future__ import annotations

import asyncio

import pytest

from services.rollout.admission import Admission, admission_capacity


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


async def test_gate_blocks_until_version_bump():
    gate = Admission(max_staleness=0, groups_per_step=2)
    await gate.acquire()
    await gate.acquire()
    blocked = asyncio.create_task(gate.acquire())
    await asyncio.sleep(0.05)
    assert not blocked.done()
    await gate.release(published=True)  # a finished group does not free a slot: it is accepted
    await asyncio.sleep(0.05)
    assert not blocked.done()
    await gate.set_version(1)
    await asyncio.wait_for(blocked, 1)
    assert gate.running == 2 and gate.accepted == 1


async def test_failed_group_frees_its_slot_and_running_cap():
    gate = Admission(max_staleness=5, groups_per_step=10, max_running=1)
    await gate.acquire()
    blocked = asyncio.create_task(gate.acquire())
    await asyncio.sleep(0.02)
    assert not blocked.done()  # capacity is there, but only one may run at once
    await gate.release(published=False)
    await asyncio.wait_for(blocked, 1)
    assert gate.accepted == 0 and gate.running == 1


async def test_stale_version_event_is_ignored():
    gate = Admission(max_staleness=0, groups_per_step=1, version=3)
    await gate.set_version(2)
    assert gate.version == 3


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


async def test_mark_opens_the_gate_without_a_version_bump():
    """A step that trained nothing publishes no version; its mark alone lets the next groups start."""
    gate = Admission(max_staleness=0, groups_per_step=2, version=4, accepted=8)
    await gate.set_consumed(6)
    assert gate.capacity == 0
    blocked = asyncio.create_task(gate.acquire())
    await asyncio.sleep(0.05)
    assert not blocked.done()
    await gate.set_consumed(8)
    await asyncio.wait_for(blocked, 1)
    assert gate.version == 4 and gate.running == 1
