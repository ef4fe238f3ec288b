"""Admission control: the gate's waiting behaviour (the capacity formula: tests/unit/test_staleness.py)."""

from __future__ import annotations

import asyncio

from services.rollout.admission import Admission


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
