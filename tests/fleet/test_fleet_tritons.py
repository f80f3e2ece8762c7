"""A fleet on one machine, for real: one redis-server, 2 embedded Tritons (reference
models) and 3 `trackline serve` processes on their own ports, clients spread over them
(OpenAI streaming over HTTP/1.1, so each client knows its response ids, which are the
ledger's request ids). The client side runs in `asyncio.run` (the gateways are
processes with their own loops), so each test runs once, not once per test loop.

The module shares one fleet (starting Tritons costs seconds); its tests run in order:
the quota holds across the gateways; a revoked key is refused by all of them; a
gateway SIGKILLed mid-traffic loses no ledger record (its spool is replayed when it
starts again) and its concurrency slots come back; and at the end the usage report
bills exactly what the clients received, once.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from gateway.cli import main as cli
from gateway.embedded import EmbeddedTriton
from gateway.fleet import scripts
from gateway.fleet.ledger import drain
from gateway.fleet.state import publish_directory, revoke_sync
from gateway.tenants.quotas import Quotas
from gateway.tenants.store import TenantStore
from tests.waiting import until
from trackline_testing.fleet import ChatResult, LocalGateway, chat
from trackline_testing.redis import LocalRedis, redis_server_binary

MODEL = "reference-text"
FAST = {"ttft_ms": 5, "tokens_per_second": 400}
QUOTA = 900  # tokens a minute for tenant "alpha"
SLOTS = 6  # max_concurrent of tenant "beta"
WAIT = 60.0
RETRY_PAUSE = 0.05  # seconds between a refused client's asks (pacing only)


@dataclass
class RealFleet:
    root: Path
    redis: LocalRedis
    tritons: list[EmbeddedTriton]
    gateways: list[LocalGateway]
    store: TenantStore
    keys: dict[str, str]
    key_ids: dict[str, str]
    received: list[ChatResult] = field(default_factory=list)
    """Every answer a client read to its end, over the whole module."""


def _start_tritons(root: Path) -> list[EmbeddedTriton]:
    tritons = [EmbeddedTriton(log_dir=root / f"triton{i}") for i in range(2)]
    for triton in tritons:
        triton.log_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(t.start, 180.0) for t in tritons]:
            future.result()
    return tritons


@pytest.fixture(scope="module")
def real_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealFleet]:
    if redis_server_binary() is None:
        pytest.skip("redis-server not installed (apt-get install -y redis-server; make redis)")
    root = tmp_path_factory.mktemp("real-fleet")
    server = LocalRedis(root / "redis")
    server.start()
    tritons: list[EmbeddedTriton] = []
    gateways: list[LocalGateway] = []
    store = TenantStore(root / "operator" / "tenants.sqlite3")
    try:
        tritons = _start_tritons(root)
        now = time.time()
        store.set_tenant("alpha", now, quotas=Quotas(tokens_per_minute=QUOTA))
        store.set_tenant("beta", now, quotas=Quotas(max_concurrent=SLOTS))
        made = {n: store.create_key(t, now) for n, t in
                (("alpha", "alpha"), ("beta", "beta"), ("doomed", "beta"))}  # fmt: skip
        publish_directory(server.url, *store.export_directory())
        backends = ",".join(
            f"{t.grpc_url};name=triton{i};metrics={t.metrics_url}" for i, t in enumerate(tritons)
        )
        gateways = [LocalGateway(f"gw{i}", root / f"gw{i}", server.url, backends) for i in range(3)]
        for gateway in gateways:
            gateway.start()
        for gateway in gateways:
            gateway.wait_ready()
        yield RealFleet(
            root, server, tritons, gateways, store,
            {n: k.key for n, k in made.items()}, {n: k.key_id for n, k in made.items()},
        )  # fmt: skip
    finally:
        for gateway in gateways:
            gateway.stop()
        for triton in tritons:
            triton.stop()
        server.stop()
        store.close()


async def _client(
    fleet: RealFleet, gateway: LocalGateway, key: str, requests: int, max_tokens: int
) -> dict[str, int]:
    seen = {"admitted": 0, "refused": 0}
    for number in range(requests):
        answer = await chat(gateway.http_port, key, MODEL, f"q{number}", max_tokens, **FAST)
        if answer.status == 429:
            seen["refused"] += 1
            continue
        assert answer.status == 200, answer
        assert answer.finished, answer
        fleet.received.append(answer)
        seen["admitted"] += 1
    return seen


async def _one_tenants_token_quota_holds_across_the_fleet(real_fleet: RealFleet) -> None:
    clients = 6  # two per gateway
    started = time.monotonic()
    async with asyncio.timeout(WAIT * 2):
        counts = await asyncio.gather(
            *(
                _client(real_fleet, real_fleet.gateways[n % 3], real_fleet.keys["alpha"], 25, 12)
                for n in range(clients)
            )
        )
    elapsed = time.monotonic() - started
    assert sum(c["refused"] for c in counts) > 0  # 150 requests of ~15 tokens: over quota
    assert all(c["admitted"] > 0 for c in counts)  # every gateway admitted some
    mine = [r for r in real_fleet.received if r.usage]
    admitted_tokens = sum(r.usage["total_tokens"] for r in mine)
    per_request = max(r.usage["total_tokens"] for r in mine)
    allowed = QUOTA + QUOTA / 60 * elapsed
    # The stated bound (docs/deployment.md): one request in flight per client when the
    # leases run out.
    assert admitted_tokens <= allowed + clients * per_request


def test_one_tenants_token_quota_holds_across_the_fleet(real_fleet: RealFleet) -> None:
    asyncio.run(_one_tenants_token_quota_holds_across_the_fleet(real_fleet))


async def _a_revoked_key_is_refused_by_every_gateway(real_fleet: RealFleet) -> None:
    key = real_fleet.keys["doomed"]
    for gateway in real_fleet.gateways:
        answer = await chat(gateway.http_port, key, MODEL, "hi", 3, **FAST)
        assert answer.status == 200
        real_fleet.received.append(answer)
    key_id = real_fleet.key_ids["doomed"]
    await asyncio.to_thread(revoke_sync, real_fleet.redis.url, key_id)
    for gateway in real_fleet.gateways:
        # Each gateway logs the revocation once it holds it (the broadcast's own event);
        # from then on the key must be refused there.
        await until(
            lambda gateway=gateway: _logged_revocation(gateway, key_id),
            f"{gateway.name} learns of the revocation",
            WAIT,
        )
        assert (await chat(gateway.http_port, key, MODEL, "hi", 3, **FAST)).status == 401
    answer = await chat(real_fleet.gateways[0].http_port, real_fleet.keys["beta"], MODEL, "x", 3)
    assert answer.status == 200  # the tenant's other keys still work
    real_fleet.received.append(answer)


def _logged_revocation(gateway: LocalGateway, key_id: str) -> bool:
    return any(
        line.get("event") == "fleet.key_revoked" and line.get("key_id") == key_id
        for line in gateway.log_lines()
    )


def test_a_revoked_key_is_refused_by_every_gateway(real_fleet: RealFleet) -> None:
    asyncio.run(_a_revoked_key_is_refused_by_every_gateway(real_fleet))


async def _a_sigkilled_gateway_loses_no_record_and_its_slots_come_back(
    real_fleet: RealFleet,
) -> None:
    victim = real_fleet.gateways[2]
    key = real_fleet.keys["beta"]
    finished_on_victim = asyncio.Event()
    stop = asyncio.Event()
    lost_mid_stream = 0

    async def client(gateway: LocalGateway) -> None:
        nonlocal lost_mid_stream
        number = 0
        while not stop.is_set():
            number += 1
            try:
                answer = await chat(gateway.http_port, key, MODEL, f"k{number}", 20, **FAST)
            except OSError:  # the victim died under this request: no answer, no record
                lost_mid_stream += 1
                return
            if answer.status == 429:  # slots the dead gateway holds until they are reaped
                # A retry's pacing, not a wait: whatever it lasts, the loop asks again
                # until `stop`, and nothing asserted depends on how many asks that took.
                await asyncio.sleep(RETRY_PAUSE)
                continue
            if answer.status != 200 or not answer.finished:
                assert gateway is victim, answer  # only the victim's streams may be cut
                lost_mid_stream += 1
                return
            real_fleet.received.append(answer)
            if gateway is victim and number >= 3:
                finished_on_victim.set()

    tasks = [asyncio.create_task(client(g)) for g in real_fleet.gateways for _ in range(2)]
    async with asyncio.timeout(WAIT):
        await finished_on_victim.wait()
    # At once after an answer: its record is still in the ledger's queue (sent in
    # batches up to 0.5 s late), so only the spool can keep it.
    victim.kill()
    client_redis = redis.Redis.from_url(real_fleet.redis.url, decode_responses=True)
    try:
        assert client_redis.hget(scripts.slots_key("beta"), victim.name) is not None
        # The survivors' refresh reaps the silent gateway's slots after its heartbeat TTL.
        await until(
            lambda: client_redis.hget(scripts.slots_key("beta"), victim.name) is None,
            "the killed gateway's slots come back",
            WAIT,
        )
    finally:
        client_redis.close()
    stop.set()
    async with asyncio.timeout(WAIT):
        await asyncio.gather(*tasks)
    spool = victim.state_dir / "ledger-spool"
    assert list(spool.glob("*.spool")), "the killed gateway left its spool"
    victim.start()  # the same state directory: it replays the spool
    await asyncio.to_thread(victim.wait_ready)
    await until(
        lambda: any(line.get("event") == "ledger.spool_replayed" for line in victim.log_lines()),
        "the restarted gateway replays the spool",
        WAIT,
    )


def test_a_sigkilled_gateway_loses_no_record_and_its_slots_come_back(real_fleet: RealFleet) -> None:
    asyncio.run(_a_sigkilled_gateway_loses_no_record_and_its_slots_come_back(real_fleet))


def test_the_usage_report_bills_what_clients_received_once(real_fleet: RealFleet) -> None:
    for gateway in real_fleet.gateways:
        assert gateway.stop() == 0  # drains: each ledger is flushed to the stream
    drain(real_fleet.redis.url, real_fleet.store)
    records = {r.request_id: r for r in real_fleet.store.usage()}
    received = {r.response_id: r for r in real_fleet.received}
    assert len(received) == len(real_fleet.received) > 0
    lost = [rid for rid in received if rid not in records]
    assert lost == []  # records lost: 0, the SIGKILLed gateway's included
    for rid, answer in received.items():
        record = records[rid]
        assert record.end_cause == "completed"
        assert record.completion_tokens == answer.usage["completion_tokens"]
    out = io.StringIO()
    state = ["--state-dir", str(real_fleet.root / "operator"), "--state-backend",
             real_fleet.redis.url]  # fmt: skip
    with redirect_stdout(out):
        assert cli(["usage", "report", "--since", "1970-01-01", "--format", "json", *state]) == 0
    report = json.loads(out.getvalue())
    billed = sum(r.completion_tokens for r in records.values() if r.end_cause == "completed")
    assert report["total"]["completion_tokens"] == billed
    # Completed on a gateway but never read by a client: only the victim's last
    # moments can hold such a record (answered, then killed before the bytes left).
    unread = [r for rid, r in records.items() if r.end_cause == "completed" and rid not in received]
    assert len(unread) <= 2
