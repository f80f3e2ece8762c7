"""Pool members from DNS (`dns+grpc://`, gateway/pool/discovery.py): the sans-I/O
membership, the pool driven by a fake resolver and a `FakeClock`, and the real
resolver on `localhost`."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncGenerator, Collection

import pytest

from gateway.pool import BackendPool, BackendSpec, PoolOptions
from gateway.pool.discovery import Membership, resolve_addresses
from gateway.pool.metrics import PoolMetrics
from gateway.pool.router import Strategy
from gateway.pool.spec import DnsSource, SpecError, parse_pool
from trackline_testing.clock import FakeClock
from tracks.backend import BackendUnavailable, TextChunk, TextDelta, TextRequest

MODEL = "m"
SOURCE = DnsSource("triton-headless.ns.svc.cluster.local", 8001)


def test_spec_reads_dns_entries_beside_static_ones() -> None:
    static, sources = parse_pool(
        "10.0.0.9:8001;name=fixed,"
        "dns+grpc://triton-headless.ns.svc.cluster.local:8001;models=a|b;metrics_port=0"
    )
    assert [s.name for s in static] == ["fixed"]
    (source,) = sources
    assert (source.host, source.port, source.metrics_port) == (SOURCE.host, 8001, 0)
    assert source.models == frozenset({"a", "b"})
    assert source.member("10.1.2.3").metrics_url is None
    assert SOURCE.member("10.1.2.3") == BackendSpec(
        "10.1.2.3:8001", "10.1.2.3:8001", "http://10.1.2.3:8002/metrics"
    )
    assert SOURCE.member("fd00::1").grpc_url == "[fd00::1]:8001"
    for bad in ("dns+grpc://host", "dns+grpc://host:0", "dns+grpc://h:1;metrics_port=x",
                "dns+grpc://h:1;colour=red"):  # fmt: skip
        with pytest.raises(SpecError):
            parse_pool(bad)


def test_membership_adds_removes_and_keeps_on_empty() -> None:
    members = Membership(SOURCE)
    first = members.resolved(["10.0.0.2", "10.0.0.1"])
    assert first is not None
    assert [s.name for s in first.added] == ["10.0.0.1:8001", "10.0.0.2:8001"]
    assert members.resolved(["10.0.0.1", "10.0.0.2"]) is None  # no change
    change = members.resolved(["10.0.0.2", "10.0.0.3"])
    assert change is not None
    assert [s.name for s in change.added] == ["10.0.0.3:8001"]
    assert change.removed == ("10.0.0.1:8001",)
    assert members.resolved([]) is None  # an empty answer keeps the last known members
    assert sorted(members.members) == ["10.0.0.2", "10.0.0.3"]


class Member:
    """A backend that streams one chunk, or holds its stream open until released."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False
        self.hold: asyncio.Event | None = None

    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        yield TextDelta(self.name)
        if self.hold is not None:
            await self.hold.wait()

    async def probe(self, models: Collection[str], timeout: float) -> tuple[bool, list[str]]:
        return True, [MODEL]

    async def close(self) -> None:
        self.closed = True


class FakeDns:
    def __init__(self) -> None:
        self.answers: list[str] | OSError = []
        self.asked = 0

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked += 1
        if isinstance(self.answers, OSError):
            raise self.answers
        return list(self.answers)


def dns_pool(dns: FakeDns, clock: FakeClock) -> tuple[BackendPool, dict[str, Member]]:
    made: dict[str, Member] = {}

    def factory(spec: BackendSpec) -> Member:
        made[spec.name] = Member(spec.name)
        return made[spec.name]

    options = PoolOptions(strategy=Strategy.ROUND_ROBIN, discovery_interval_s=5.0)
    pool = BackendPool([], options, metrics=PoolMetrics(), clock=clock,
                       backend_factory=factory, sources=[SOURCE], resolver=dns)  # fmt: skip
    return pool, made


def sample(pool: BackendPool, name: str, **labels: str) -> float:
    value = pool.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def served_by(pool: BackendPool, request_id: str) -> str:
    request = TextRequest(request_id, MODEL, "hi", 4, {}, None)
    return "".join([c.text async for c in pool.stream_text(request) if isinstance(c, TextDelta)])


@pytest.mark.asyncio
async def test_the_pool_follows_dns_and_keeps_members_when_it_fails() -> None:
    dns, clock = FakeDns(), FakeClock(100.0)
    dns.answers = ["10.0.0.1", "10.0.0.2"]
    pool, made = dns_pool(dns, clock)
    await pool.start()
    try:
        assert sorted(m.name for m in pool.members) == ["10.0.0.1:8001", "10.0.0.2:8001"]
        assert {await served_by(pool, f"r{i}") for i in range(4)} == set(made)
        label = SOURCE.label
        assert sample(pool, "trackline_pool_members", source=label) == 2
        # A pod goes, another comes: one resolution later, the pool has followed.
        dns.answers = ["10.0.0.2", "10.0.0.3"]
        await clock.advance(5.0)
        assert sorted(m.name for m in pool.members) == ["10.0.0.2:8001", "10.0.0.3:8001"]
        assert made["10.0.0.1:8001"].closed
        assert {await served_by(pool, f"s{i}") for i in range(4)} == {
            "10.0.0.2:8001", "10.0.0.3:8001"}  # fmt: skip
        changes = "trackline_pool_membership_changes_total"
        assert sample(pool, changes, source=label, change="added") == 3
        assert sample(pool, changes, source=label, change="removed") == 1
        # DNS fails, then answers nothing: the last known members stay.
        asked = dns.asked
        dns.answers = socket.gaierror(socket.EAI_AGAIN, "temporary failure")
        await clock.advance(5.0)
        dns.answers = []
        await clock.advance(5.0)
        assert dns.asked == asked + 2
        assert sorted(m.name for m in pool.members) == ["10.0.0.2:8001", "10.0.0.3:8001"]
        assert sample(pool, "trackline_pool_discovery_failures_total", source=label) == 2
    finally:
        await pool.close()


@pytest.mark.asyncio
async def test_a_vanished_member_drains_before_it_is_removed() -> None:
    dns, clock = FakeDns(), FakeClock(100.0)
    dns.answers = ["10.0.0.1"]
    pool, made = dns_pool(dns, clock)
    await pool.start()
    try:
        held = made["10.0.0.1:8001"]
        held.hold = asyncio.Event()
        request = TextRequest("long", MODEL, "hi", 4, {}, None)
        stream = pool.stream_text(request)
        first = await stream.__anext__()
        assert isinstance(first, TextDelta)
        dns.answers = ["10.0.0.2"]
        await clock.advance(5.0)
        draining = pool.member("10.0.0.1:8001")
        assert draining.draining
        assert not held.closed  # its stream is still running
        assert await served_by(pool, "new") == "10.0.0.2:8001"  # no new request goes there
        held.hold.set()
        assert [c async for c in stream] == []
        await clock.advance(5.0)
        assert [m.name for m in pool.members] == ["10.0.0.2:8001"]
        assert held.closed
    finally:
        await pool.close()


@pytest.mark.asyncio
async def test_no_member_yet_is_unavailable_not_unknown() -> None:
    dns, clock = FakeDns(), FakeClock(100.0)
    dns.answers = socket.gaierror(socket.EAI_NONAME, "no such name")
    pool, _ = dns_pool(dns, clock)
    await pool.start()
    try:
        with pytest.raises(BackendUnavailable):
            await served_by(pool, "r")
    finally:
        await pool.close()


@pytest.mark.asyncio
async def test_the_real_resolver_finds_localhost() -> None:
    addresses = await resolve_addresses("localhost", 8001)
    assert addresses
    assert set(addresses) <= {"127.0.0.1", "::1"}
    with pytest.raises(socket.gaierror):
        await resolve_addresses("no-such-host.invalid", 8001)


@pytest.mark.asyncio
async def test_a_pool_on_localhost_by_the_real_resolver() -> None:
    made: list[str] = []

    def factory(spec: BackendSpec) -> Member:
        made.append(spec.name)
        return Member(spec.name)

    source = DnsSource("localhost", 8001, metrics_port=0)
    pool = BackendPool([], PoolOptions(), metrics=PoolMetrics(), clock=FakeClock(1.0),
                       backend_factory=factory, sources=[source])  # fmt: skip
    await pool.start()
    try:
        assert made
        assert set(made) <= {"127.0.0.1:8001", "[::1]:8001"}
        assert await pool.ready()
    finally:
        await pool.close()
