"""The fleet's choice of server, by hand-made cases: least outstanding among the servers up and serving the
live version, ties to the less used then the lower URL; membership; leases; waiting for a server."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client import CollectorRegistry, generate_latest

from services.rollout.fleet import Fleet, Server, pick
from services.rollout.fleet_watch import busy_not_down
from services.rollout.metrics import FleetCollector

A, B, C = "http://a:8002", "http://b:8002", "http://c:8002"


def ready(url: str, *, version: int = 0, outstanding: int = 0, episodes: int = 0) -> Server:
    return Server(url, up=True, version=version, outstanding=outstanding, episodes=episodes)


def fleet_of(*urls: str, live: list[int] | None = None) -> Fleet:
    live = live if live is not None else [0]
    fleet = Fleet(urls, lambda: live[0])
    for url in urls:
        fleet.observe(url, up=True, version=live[0])
    return fleet


def test_least_outstanding_wins():
    servers = [ready(A, outstanding=3), ready(B, outstanding=1), ready(C, outstanding=2)]
    assert pick(servers, live=0).url == B


def test_ties_go_to_the_less_used_then_the_lower_url():
    assert pick([ready(A, outstanding=1, episodes=9), ready(B, outstanding=1, episodes=4)], live=0).url == B
    assert pick([ready(B, outstanding=1, episodes=4), ready(A, outstanding=1, episodes=4)], live=0).url == A


def test_a_server_behind_the_live_version_gets_nothing_even_when_idle():
    servers = [ready(A, version=4, outstanding=7), ready(B, version=3)]
    assert pick(servers, live=4).url == A
    assert pick(servers, live=3).url == B  # both serve 3 or newer: B is idle
    assert pick([ready(B, version=3)], live=4) is None


def test_down_unprobed_excluded_and_departed_servers_get_nothing():
    down = Server(A, up=False, version=0)
    unprobed = Server(B, up=True, version=None)
    left = ready(C)
    left.member = False
    assert pick([down, unprobed, left], live=0) is None
    assert pick([ready(A), ready(B, outstanding=5)], live=0, exclude={A}).url == B


def test_leases_spread_episodes_and_count_them():
    fleet = fleet_of(A, B)
    # A, B both idle: A (lower URL); then B (idle); then both have 1 outstanding and 1 episode: A; then B.
    leased = [fleet.lease() for _ in range(4)]
    assert [s.url for s in leased] == [A, B, A, B]
    fleet.release(leased[1])  # B: 1 outstanding, 2 episodes; A: 2 and 2
    assert fleet.lease().url == B
    fleet.release(leased[0])
    fleet.release(leased[2])  # A: 0 outstanding, 2 episodes; B: 2 and 3
    assert fleet.lease().url == A
    assert {u: (s.outstanding, s.episodes) for u, s in fleet.servers.items()} == {A: (1, 3), B: (2, 3)}


def test_a_lagging_server_waits_until_it_caught_up():
    live = [1]
    fleet = fleet_of(A, B, live=live)
    fleet.observe(B, up=True, version=0)  # B restarted with its start-up weights
    assert [fleet.lease().url for _ in range(3)] == [A, A, A]
    fleet.observe(B, up=True, version=1)
    assert fleet.lease().url == B
    live[0] = 2  # the trainer published 2 and loaded it into A only: neither is known to serve it yet
    assert fleet.lease() is None
    fleet.observe(A, up=True, version=2)
    assert fleet.lease().url == A


def test_a_failed_server_is_out_until_a_probe_answers():
    fleet = fleet_of(A, B)
    a = fleet.lease()
    fleet.failed(a)
    fleet.release(a)
    assert fleet.lease().url == B and fleet.lease().url == B
    assert fleet.servers[A].failures == 1
    fleet.observe(A, up=True)  # the version is kept when the probe gives none
    assert fleet.lease().url == A


def test_announced_servers_join_and_leave_listed_ones_stay():
    fleet = Fleet([A + "/"], lambda: 0)
    assert list(fleet.servers) == [A]  # one spelling per server
    fleet.set_announced([B, C + "/", A])
    assert sorted(fleet.servers) == [A, B, C]
    assert fleet.servers[B].version is None  # joins unprobed: no episode before the first probe
    held = fleet.servers[B]
    fleet.set_announced([C])
    assert sorted(fleet.servers) == [A, C] and not held.member  # A is listed in the settings
    fleet.observe(B, up=True, version=0)  # a probe that was running when B left: ignored
    assert B not in fleet.servers


async def test_acquire_waits_for_a_server_to_catch_up():
    live = [1]
    fleet = fleet_of(A, live=live)
    fleet.observe(A, up=True, version=0)
    waiter = asyncio.create_task(fleet.acquire(timeout_s=5))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    fleet.observe(A, up=True, version=1)
    assert (await asyncio.wait_for(waiter, 1)).url == A


async def test_acquire_waits_past_its_timeout_while_the_live_weights_are_loading():
    """After an announcement every server is behind until the watch's load: an episode waits that out (a full
    reload can outlast ``server_wait_s``), and gives up once no load is under way."""
    live = [1]
    fleet = fleet_of(A, live=live)
    fleet.observe(A, up=True, version=0)
    fleet.set_loading(A, True)
    waiter = asyncio.create_task(fleet.acquire(timeout_s=0.05))
    await asyncio.sleep(0.3)
    assert not waiter.done() and fleet.status()["servers"][A]["loading"]
    fleet.set_loading(A, False)
    fleet.observe(A, up=True, version=1)
    assert (await asyncio.wait_for(waiter, 1)).url == A
    fleet.release(fleet.servers[A])
    live[0] = 2
    fleet.set_loading(A, True)
    fleet.set_loading(A, False)  # the load failed: nothing to wait for
    assert await asyncio.wait_for(fleet.acquire(timeout_s=0.05), 1) is None


async def test_acquire_gives_up_after_the_wait_and_at_once_when_every_server_is_excluded():
    fleet = fleet_of(A, B)
    fleet.observe(B, up=False)
    assert await fleet.acquire(exclude={A}, timeout_s=0.05) is None  # B might come back: it waited
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await fleet.acquire(exclude={A, B}, timeout_s=5) is None
    assert loop.time() - start < 0.5


def test_a_probe_timeout_marks_only_an_idle_or_down_server_down():
    busy, idle, down = ready(A, outstanding=3), ready(B), Server(C, up=False, version=0, outstanding=2)
    assert busy_not_down(busy, TimeoutError())  # asyncio.wait_for's timeout
    assert busy_not_down(busy, httpx.ReadTimeout("slow"))
    assert not busy_not_down(busy, httpx.ConnectError("refused"))  # gone, however busy it was
    assert not busy_not_down(idle, TimeoutError())
    assert not busy_not_down(down, TimeoutError())
    assert not busy_not_down(None, TimeoutError())  # it left while the probe ran


def test_per_server_metrics_are_read_from_the_fleet_at_each_scrape():
    fleet = fleet_of(A, B, live=[3])
    fleet.servers["http://c:8002"] = Server("http://c:8002")  # joined, not probed yet
    registry = CollectorRegistry()
    registry.register(FleetCollector(fleet.status))
    a = fleet.lease()
    fleet.failed(a)
    fleet.lease()
    text = generate_latest(registry).decode()
    assert f'coda_rollout_server_up{{server="{A}"}} 0.0' in text  # failed: down until a probe answers
    assert f'coda_rollout_server_up{{server="{B}"}} 1.0' in text
    assert f'coda_rollout_server_version{{server="{B}"}} 3.0' in text
    assert 'coda_rollout_server_version{server="http://c:8002"} -1.0' in text
    assert f'coda_rollout_server_outstanding_episodes{{server="{A}"}} 1.0' in text
    assert f'coda_rollout_server_episodes_total{{server="{B}"}} 1.0' in text
    assert f'coda_rollout_server_failures_total{{server="{A}"}} 1.0' in text
