"""Admission shared by rollout replicas through Redis: together they never exceed (s + v + 1)·g."""

from __future__ import annotations

import asyncio

from services.rollout.admission import RedisAdmission


async def test_two_replicas_share_one_budget(redis_client):
    a = RedisAdmission(redis_client, "a", 0, 3, poll_s=0.02)
    b = RedisAdmission(redis_client, "b", 0, 3, poll_s=0.02)
    await a.acquire()
    await a.acquire()
    await b.acquire()
    blocked = [asyncio.create_task(a.acquire()), asyncio.create_task(b.acquire())]
    await asyncio.sleep(0.1)
    assert not any(t.done() for t in blocked)  # 3 running across both replicas = (0 + 0 + 1)·3
    redis_client.incr("rollout:published")  # b's group published (the producer INCRs after XADD) ...
    await b.release(published=True)
    await asyncio.sleep(0.1)
    assert not any(t.done() for t in blocked)  # ... accepted + running is still 3
    await a.release(published=False)  # a failed group frees its slot for whoever polls first
    await asyncio.wait_for(asyncio.wait(blocked, return_when=asyncio.FIRST_COMPLETED), 1)
    assert sum(t.done() for t in blocked) == 1
    for gate in (a, b):
        await gate.set_version(1)  # both see the version bump: 3 more slots
    await asyncio.wait_for(asyncio.gather(*blocked), 1)
    running = {k.decode(): int(v) for k, v in redis_client.hgetall("rollout:running").items()}
    assert sum(running.values()) == 3  # 2 + 1, minus the two released, plus the two waiters


async def test_a_dead_replica_stops_holding_slots(redis_client):
    dead = RedisAdmission(redis_client, "dead", 0, 1, heartbeat_ttl_s=0.2)
    await dead.acquire()
    alive = RedisAdmission(redis_client, "alive", 0, 1, heartbeat_ttl_s=0.2, poll_s=0.05)
    waiter = asyncio.create_task(alive.acquire())
    await asyncio.sleep(0.1)
    assert not waiter.done()
    await asyncio.wait_for(waiter, 2)  # the dead replica's heartbeat expired: its slot is released
    assert redis_client.hget("rollout:running", "dead") is None
