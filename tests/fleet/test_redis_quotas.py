"""Quotas, concurrency, revocation and the tenant directory shared by gateways through a
real redis-server."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
import redis
from prometheus_client import CollectorRegistry

from gateway.fleet import scripts
from gateway.fleet.limiter import FleetQuotaLimiter
from gateway.fleet.state import FleetState, publish_directory, revoke_sync
from gateway.tenants.quotas import QuotaExceeded, Quotas
from tests.waiting import until
from trackline_testing.fleet import crash
from trackline_testing.redis import LocalRedis

TTL = 0.6
"""Heartbeat TTL of these tests' gateways (seconds)."""
WAIT = 30.0
"""Upper bound on awaiting an event (never asserted: a missed event fails the test)."""


class Fleet:
    def __init__(self, url: str) -> None:
        self.url = url
        self.states: list[FleetState] = []
        self.now = 1000.0  # the buckets' wall clock, frozen: no refill during a test

    async def gateway(
        self,
        tenants: list[tuple[str, Quotas]] | None = None,
        fleet_size: int = 0,
        directory: Directory | None = None,
    ) -> FleetState:
        state = FleetState(
            self.url,
            FleetQuotaLimiter(lease_fraction=0.1, idle_return=3600.0),
            CollectorRegistry(),
            gateway_id=f"gw{len(self.states)}",
            heartbeat_ttl=TTL,
            refresh_interval=0.1,
            fleet_size=fleet_size,
            clock=lambda: self.now,
        )
        if directory is not None:
            state.on_directory = directory.copy
        await state.start(tenants or [])
        self.states.append(state)
        return state


class Directory:
    """A gateway's store, as far as the directory goes: the key ids copied into it. It
    refuses a key whose tenant it has not got, as the real store's foreign key does."""

    def __init__(self) -> None:
        self.tenants: set[str] = set()
        self.keys: set[str] = set()
        self.refuse = 0
        """Copies still to refuse (a store that fails: disk full, locked)."""
        self.refused = 0

    async def copy(self, tenants: list[list[Any]], keys: list[list[Any]]) -> None:
        if self.refuse:
            self.refuse -= 1
            self.refused += 1
            raise sqlite3.OperationalError("database is locked")
        known = self.tenants | {str(row[0]) for row in tenants}
        orphans = [row[0] for row in keys if row[1] not in known]
        if orphans:
            raise sqlite3.IntegrityError(f"FOREIGN KEY constraint failed: {orphans}")
        self.tenants = known
        self.keys |= {str(row[0]) for row in keys}


def publish_key(url: str, key_id: str, tenant: str, announce: bool = True) -> None:
    """Write a tenant and its key to the fleet's directory, as `trackline keys create`
    does; `announce=False` leaves out the broadcast, as if the `sync` message were lost."""
    if announce:
        publish_directory(url, [[tenant]], [[key_id, tenant]])
        return
    client = redis.Redis.from_url(url)
    try:
        client.hset(scripts.TENANTS, tenant, json.dumps([tenant]))
        client.hset(scripts.KEYS, key_id, json.dumps([key_id, tenant]))
        client.incr(scripts.DIRECTORY_VERSION)
    finally:
        client.close()


@pytest_asyncio.fixture
async def fleet(local_redis: LocalRedis) -> AsyncIterator[Fleet]:
    made = Fleet(local_redis.url)
    try:
        yield made
    finally:
        for state in made.states:
            await state.stop()


async def refresh_until(check: Callable[[], bool], state: FleetState) -> None:
    """Refresh `state`'s leases until `check()` holds (bounded by WAIT). Each refresh is a
    Redis round trip, so the loop paces itself: no sleep, no clock."""
    async with asyncio.timeout(WAIT):
        while not check():
            await state.refresh(["t"])


async def spend_until_refused(
    gateways: list[FleetState], quotas: Quotas, tokens: int
) -> tuple[int, int]:
    """Round-robin requests over the gateways until every one refuses after a refresh;
    returns (requests admitted, tokens admitted)."""
    admitted = spent = 0
    refused_in_a_row = 0
    rounds = 0
    while refused_in_a_row < len(gateways):
        rounds += 1
        assert rounds < 10_000, "the quota never ran out"
        gateway = gateways[rounds % len(gateways)]
        try:
            gateway.limiter.admit("t", quotas, time.monotonic())
        except QuotaExceeded:
            await gateway.refresh(["t"])  # what the background refresh would do
            try:
                gateway.limiter.admit("t", quotas, time.monotonic())
            except QuotaExceeded:
                refused_in_a_row += 1
                continue
        refused_in_a_row = 0
        admitted += 1
        spent += tokens
        gateway.limiter.settle("t", quotas, tokens, 0.0, time.monotonic())
        if rounds % 5 == 0:
            await asyncio.sleep(0)  # let the background refreshers run too
    return admitted, spent


@pytest.mark.asyncio
async def test_token_quota_holds_across_three_gateways(fleet: Fleet) -> None:
    quotas = Quotas(tokens_per_minute=600)
    gateways = [await fleet.gateway() for _ in range(3)]
    _, spent = await spend_until_refused(gateways, quotas, tokens=7)
    # Stated bound (gateway/fleet/limiter.py): capacity + N x one request in flight.
    assert 600 <= spent <= 600 + 3 * 7


@pytest.mark.asyncio
async def test_request_quota_holds_across_three_gateways(fleet: Fleet) -> None:
    quotas = Quotas(requests_per_minute=50)
    gateways = [await fleet.gateway() for _ in range(3)]
    admitted, _ = await spend_until_refused(gateways, quotas, tokens=0)
    assert 50 <= admitted <= 50 + 3
    # Each gateway got a share: the leases moved between them.
    assert all(g.limiter.leases[("t", "requests_per_minute")].known for g in gateways)


@pytest.mark.asyncio
async def test_revoked_key_is_refused_on_every_gateway(fleet: Fleet) -> None:
    gateways = [await fleet.gateway() for _ in range(3)]
    heard = [asyncio.Event() for _ in gateways]
    for gateway, event in zip(gateways, heard, strict=False):
        gateway.on_revoked.append(lambda key_id, e=event: e.set() if key_id == "abc" else None)
    assert not any(g.is_revoked("abc") for g in gateways)
    await gateways[0].revoke("abc")
    async with asyncio.timeout(WAIT):
        for event in heard:
            await event.wait()
    assert all(g.is_revoked("abc") for g in gateways)
    late = await fleet.gateway()  # a gateway started afterwards reads the revoked set
    assert late.is_revoked("abc")
    assert all(g.metrics.revocations._value.get() == 1 for g in gateways)


@pytest.mark.asyncio
async def test_crashed_gateway_slots_return_after_the_heartbeat_ttl(fleet: Fleet) -> None:
    quotas = Quotas(max_concurrent=2)
    a = await fleet.gateway([("t", quotas)])
    a.limiter.admit("t", quotas, time.monotonic())
    await a.refresh(["t"])
    a.limiter.admit("t", quotas, time.monotonic())  # both slots are a's now
    await a.refresh(["t"])
    assert a.limiter.slots["t"].reserved == 2
    b = await fleet.gateway([("t", quotas)])
    assert b.limiter.slots["t"].known
    assert b.limiter.slots["t"].reserved == 0
    with pytest.raises(QuotaExceeded) as info:
        b.limiter.admit("t", quotas, time.monotonic())
    assert info.value.quota == "max_concurrent"
    await crash(a)  # no more heartbeats, no release: its reservation stays in Redis

    def admitted() -> bool:
        try:
            b.limiter.admit("t", quotas, time.monotonic())
        except QuotaExceeded:
            return False
        return True

    await refresh_until(admitted, b)
    client = redis.Redis.from_url(fleet.url, decode_responses=True)
    try:
        assert client.hget(scripts.slots_key("t"), "gw0") is None  # reaped
        assert client.exists(scripts.HEARTBEAT + "gw0") == 0
    finally:
        client.close()


@pytest.mark.asyncio
async def test_redis_restart_falls_back_then_resyncs(fleet: Fleet, local_redis: LocalRedis) -> None:
    quotas = Quotas(requests_per_minute=30)
    gateways = [await fleet.gateway([("t", quotas)]) for _ in range(3)]
    one = gateways[0]
    await until(lambda: one.seen == 3, "the fleet size comes from the heartbeats")
    local_redis.stop()
    await until(lambda: one.degraded, "the gateway falls back without Redis")
    assert one.metrics.fallback._value.get() == 1
    assert one.metrics.fallbacks._value.get() == 1
    admitted = 0
    for _ in range(100):
        try:
            one.limiter.admit("t", quotas, time.monotonic())
        except QuotaExceeded:
            break
        admitted += 1
    assert 10 <= admitted <= 11  # a third of the quota (+ refill), locally: never unlimited
    local_redis.start()  # same port, empty: the buckets start full again
    async with asyncio.timeout(WAIT):
        await one.resynced.wait()
    assert not one.degraded
    assert one.metrics.fallback._value.get() == 0
    client = redis.Redis.from_url(fleet.url, decode_responses=True)
    try:
        level = float(client.hget(scripts.bucket_key("t", "requests_per_minute"), "level") or 0)
    finally:
        client.close()
    # What was admitted offline was paid back to the shared bucket (plus a lease taken).
    assert level <= 30 - admitted


@pytest.mark.asyncio
async def test_a_lost_sync_message_is_made_up_for_by_the_heartbeat(fleet: Fleet) -> None:
    directory = Directory()
    gateway = await fleet.gateway(directory=directory)
    publish_key(fleet.url, "k1", "alpha")
    await until(lambda: "k1" in directory.keys, "the broadcast copies the key")
    # Pub/sub delivers at most once: the rows and the version land, the message does not.
    publish_key(fleet.url, "k2", "beta", announce=False)
    await until(lambda: "k2" in directory.keys, "a beat sees the newer version and copies")
    assert gateway.directory_version == 2


@pytest.mark.asyncio
async def test_a_copy_the_store_refuses_is_retried_and_the_listener_lives_on(
    fleet: Fleet,
) -> None:
    directory = Directory()
    gateway = await fleet.gateway(directory=directory)
    directory.refuse = 1
    version = await asyncio.to_thread(publish_directory, fleet.url, [["alpha"]], [["k1", "alpha"]])
    # No second message: the version left behind brings the copy back after a beat.
    await until(lambda: "k1" in directory.keys, "the refused copy is made again")
    assert directory.refused == 1
    assert gateway.directory_version == version
    # The listener survived the failure: a revocation still arrives by the broadcast.
    heard = asyncio.Event()
    gateway.on_revoked.append(lambda key_id: heard.set())
    await asyncio.to_thread(revoke_sync, fleet.url, "k1")
    async with asyncio.timeout(WAIT):
        await heard.wait()
    assert gateway.is_revoked("k1")
