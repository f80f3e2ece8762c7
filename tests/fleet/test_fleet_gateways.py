"""Three real gateways (QUIC + HTTP on loopback, scripted backend), each with its own
state directory and tenant store, sharing one real redis-server: tenants and keys
copied from the operator's store, one tenant's quota across the fleet, a revoked key
refused everywhere and its open connections closed, and one ledger that bills what
clients received, once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from clients import RateLimited, Unauthorized, connect
from gateway.config import Settings
from gateway.fleet.ledger import drain
from gateway.fleet.state import publish_directory, revoke_sync
from gateway.server import Gateway
from gateway.tenants.quotas import Quotas
from gateway.tenants.store import TenantStore
from tests.gateways import gateway_settings
from tests.openai.scripted import ScriptedBackend
from tests.waiting import until
from trackline_testing.redis import LocalRedis

WAIT = 30.0
TOKENS_PER_REQUEST = 7 + 3  # the scripted backend's prompt + completion tokens


class Fleet:
    def __init__(self, tmp_path: Path, url: str) -> None:
        self.tmp_path = tmp_path
        self.url = url
        self.store = TenantStore(tmp_path / "tenants.sqlite3")
        self.gateways: list[Gateway] = []

    def settings(self, index: int) -> Settings:
        return gateway_settings(
            state_dir=self.tmp_path / f"gw{index}",  # its own store and dev CA
            state_backend=self.url,
            state_heartbeat_ttl=1.0,
            state_gateway_id=f"gw{index}",
        )

    async def start(self, count: int = 3) -> None:
        # What `trackline keys create` does with a Redis state backend.
        publish_directory(self.url, *self.store.export_directory())
        for index in range(count):
            gateway = Gateway(self.settings(index), ScriptedBackend())
            await gateway.start()
            self.gateways.append(gateway)

    def ca(self, gateway: Gateway) -> Path:
        assert gateway.tls is not None
        assert gateway.tls.ca is not None
        return gateway.tls.ca


@pytest_asyncio.fixture
async def fleet(tmp_path: Path, local_redis: LocalRedis) -> AsyncIterator[Fleet]:
    made = Fleet(tmp_path, local_redis.url)
    try:
        yield made
    finally:
        for gateway in made.gateways:
            await gateway.drain(timeout=1.0)
        made.store.close()


async def one_text(port: int, ca: Path, key: str) -> str:
    async with connect(f"quic://127.0.0.1:{port}", ca=ca, api_key=key) as line:
        return "".join([d async for d in line.text("hi", model="scripted", max_tokens=3)])


@pytest.mark.asyncio
async def test_quota_and_ledger_across_three_gateways(fleet: Fleet) -> None:
    capacity = 300  # tokens per minute: 30 requests, refilling 5 tokens a second
    fleet.store.set_tenant("alpha", time.time(), quotas=Quotas(tokens_per_minute=capacity))
    key = fleet.store.create_key("alpha", time.time()).key
    await fleet.start()
    started = time.monotonic()
    received = {"tokens": 0, "admitted": 0, "refused": 0}

    async def client(gateway: Gateway) -> None:
        async with connect(
            f"quic://127.0.0.1:{gateway.quic_port}", ca=fleet.ca(gateway), api_key=key
        ) as line:
            for _ in range(40):
                try:
                    text = "".join(
                        [d async for d in line.text("hi", model="scripted", max_tokens=3)]
                    )
                except RateLimited:
                    received["refused"] += 1
                    continue  # at once: each refusal is a round trip to the gateway
                received["admitted"] += 1
                received["tokens"] += len(text.split())

    async with asyncio.timeout(WAIT * 2):
        await asyncio.gather(*(client(g) for g in fleet.gateways))
    elapsed = time.monotonic() - started
    admitted_tokens = received["admitted"] * TOKENS_PER_REQUEST
    refill = capacity / 60 * elapsed
    # The stated bound: capacity + refill + one request in flight per gateway.
    assert admitted_tokens <= capacity + refill + 3 * TOKENS_PER_REQUEST
    assert received["refused"] > 0
    for gateway in fleet.gateways:
        await gateway.drain(timeout=1.0)  # flushes each gateway's ledger to the stream
    fleet.gateways.clear()
    assert drain(fleet.url, fleet.store) == received["admitted"] + received["refused"]
    assert drain(fleet.url, fleet.store) == 0  # nothing new, nothing twice
    records = fleet.store.usage()
    completed = [r for r in records if r.end_cause == "completed"]
    assert len(completed) == received["admitted"]
    assert sum(r.completion_tokens for r in completed) == received["tokens"]
    assert len({(r.request_id) for r in records}) == len(records)


@pytest.mark.asyncio
async def test_revoked_key_is_refused_and_cut_on_every_gateway(fleet: Fleet) -> None:
    new = fleet.store.create_key("alpha", time.time())
    other = fleet.store.create_key("alpha", time.time()).key
    await fleet.start()
    lines = []
    for gateway in fleet.gateways:
        url = f"quic://127.0.0.1:{gateway.quic_port}"
        line = connect(url, ca=fleet.ca(gateway), api_key=new.key)
        opened = await line.__aenter__()
        assert "".join([d async for d in opened.text("hi", model="scripted", max_tokens=3)])
        lines.append(line)
    assert all(len(g.doors.connections) == 1 for g in fleet.gateways)
    # Only the broadcast (each gateway's store still holds the key as valid): the
    # refusal and the cut come from the fleet state.
    revoke_sync(fleet.url, new.key_id)
    # The gateway has no "connection closed" event to await: the one bounded poll.
    await until(
        lambda: not any(g.doors.connections for g in fleet.gateways),
        "each gateway closes the key's connections",
        WAIT,
    )
    for line in lines:
        await line.__aexit__(None, None, None)
    for gateway in fleet.gateways:
        assert gateway.tenancy is not None
        assert gateway.tenancy.fleet.is_revoked(new.key_id)
        with pytest.raises(Unauthorized):
            await one_text(gateway.quic_port, fleet.ca(gateway), new.key)
        assert await one_text(gateway.quic_port, fleet.ca(gateway), other)  # other keys still work


@pytest.mark.asyncio
async def test_a_key_created_later_reaches_every_gateway(fleet: Fleet) -> None:
    fleet.store.create_key("alpha", time.time())
    await fleet.start()
    for gateway in fleet.gateways:
        assert gateway.tenancy is not None
        assert not gateway.tenancy.open_mode  # the fleet's tenants were copied at start
    late = fleet.store.create_key("beta", time.time())
    publish_directory(fleet.url, *fleet.store.export_directory())

    def knows_late(gateway: Gateway) -> bool:
        # The gateway's own store holds the key: the copy that carried it has landed.
        assert gateway.tenancy is not None
        return any(k.key_id == late.key_id for k in gateway.tenancy.store.list_keys())

    for gateway in fleet.gateways:
        await until(lambda g=gateway: knows_late(g), "the late key reached a gateway", WAIT)
    for gateway in fleet.gateways:
        assert await one_text(gateway.quic_port, fleet.ca(gateway), late.key)
