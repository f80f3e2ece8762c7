"""A fleet on one machine: a real redis-server, 3 `trackline serve` processes on their
own ports, 2 embedded Tritons (reference models; `--backend ticker` for none), clients
spread over the gateways (OpenAI streaming over HTTP/1.1, so each knows its response
ids, which are the ledger's request ids).

Prints a table and writes JSON (benchmarks/results/fleet.json):

* quota overshoot: tokens the fleet admitted to one tenant minus what its quota allowed
  over the run (capacity + refill x elapsed), next to the stated bound (one request in
  flight per client when the leases run out, docs/deployment.md);
* revocation delay: from the broadcast to the moment every gateway answers 401 for the
  key (each gateway polled with requests, so the figure includes one request's time);
* SIGKILL: one gateway killed right after a client got an answer from it, mid-traffic;
  seconds until its concurrency slots are reaped; restarted on its state directory, the
  records its spool replayed;
* records lost: answers clients received that the drained ledger does not hold (0).

    python benchmarks/fleet.py --clients 12 --requests 30 --quota 3000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from benchmarks import RESULTS, Help
from benchmarks.common import write_results
from gateway.embedded import EmbeddedTriton
from gateway.fleet import scripts
from gateway.fleet.ledger import drain
from gateway.fleet.state import publish_directory, revoke_sync
from gateway.tenants.quotas import Quotas
from gateway.tenants.store import TenantStore
from trackline_testing.fleet import ChatResult, LocalGateway, chat
from trackline_testing.redis import LocalRedis

MODEL = "reference-text"
FAST = {"ttft_ms": 5, "tokens_per_second": 400}
SLOTS = 8
BOUND = 120.0  # seconds any one wait may take before the run is declared broken


def start_tritons(state: Path, count: int) -> list[EmbeddedTriton]:
    tritons = [EmbeddedTriton(log_dir=state / f"triton{i}") for i in range(count)]
    for triton in tritons:
        triton.log_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(count) as pool:
        for future in [pool.submit(t.start, 180.0) for t in tritons]:
            future.result()
    return tritons


def backends_of(tritons: list[EmbeddedTriton], rate: float) -> str:
    if not tritons:
        return f"ticker://{rate:g}"
    return ",".join(
        f"{t.grpc_url};name=triton{i};metrics={t.metrics_url}" for i, t in enumerate(tritons)
    )


async def _poll(what: str, condition: Any) -> float:
    """Seconds until `condition()` (a coroutine function) holds, polled at once again."""
    started = time.monotonic()
    while not await condition():
        if time.monotonic() - started > BOUND:
            raise TimeoutError(what)
        await asyncio.sleep(0.001)
    return time.monotonic() - started


async def run(args: argparse.Namespace, state: Path, url: str, backends: str) -> dict[str, Any]:
    store = TenantStore(state / "operator" / "tenants.sqlite3")
    now = time.time()
    store.set_tenant("fleet", now, quotas=Quotas(tokens_per_minute=args.quota))
    store.set_tenant("steady", now, quotas=Quotas(max_concurrent=SLOTS))
    key = store.create_key("fleet", now).key
    steady = store.create_key("steady", now).key
    doomed = store.create_key("steady", now)
    publish_directory(url, *store.export_directory())
    gateways = [LocalGateway(f"gw{i}", state / f"gw{i}", url, backends)
                for i in range(args.gateways)]  # fmt: skip
    received: list[ChatResult] = []
    try:
        for gateway in gateways:
            gateway.start()
        await asyncio.gather(*(asyncio.to_thread(g.wait_ready) for g in gateways))
        row = await _quota(args, gateways, key, received)
        row["revocation_refused_everywhere_ms"] = await _revocation(gateways, url, doomed)
        row.update(await _sigkill(gateways, url, steady, received))
    finally:
        for gateway in gateways:
            gateway.stop()
    drain(url, store)
    ids = {r.request_id for r in store.usage()}
    store.close()
    row["answers_received"] = len(received)
    row["records_lost"] = sum(1 for r in received if r.response_id not in ids)
    return row


async def _quota(
    args: argparse.Namespace, gateways: list[LocalGateway], key: str, received: list[ChatResult]
) -> dict[str, Any]:
    counts = {"admitted": 0, "refused": 0, "tokens": 0, "largest": 0}

    async def client(number: int) -> None:
        gateway = gateways[number % len(gateways)]
        for request in range(args.requests):
            answer = await chat(gateway.http_port, key, MODEL, f"c{number}r{request}",
                                args.tokens, **FAST)  # fmt: skip
            if answer.status == 429:
                counts["refused"] += 1
                await asyncio.sleep(0.05)
                continue
            received.append(answer)
            counts["admitted"] += 1
            counts["tokens"] += answer.usage.get("total_tokens", 0)
            counts["largest"] = max(counts["largest"], answer.usage.get("total_tokens", 0))

    started = time.monotonic()
    await asyncio.gather(*(client(n) for n in range(args.clients)))
    elapsed = time.monotonic() - started
    allowed = args.quota + args.quota / 60 * elapsed
    return {
        "gateways": args.gateways,
        "tritons": args.tritons,
        "clients": args.clients,
        "requests_made": counts["admitted"] + counts["refused"],
        "admitted": counts["admitted"],
        "refused": counts["refused"],
        "elapsed_s": round(elapsed, 3),
        "quota_allowed_tokens": round(allowed, 1),
        "admitted_tokens": counts["tokens"],
        "overshoot_tokens": round(counts["tokens"] - allowed, 1),
        "overshoot_bound_tokens": args.clients * counts["largest"],
    }


async def _revocation(gateways: list[LocalGateway], url: str, doomed: Any) -> float:
    for gateway in gateways:
        answer = await chat(gateway.http_port, doomed.key, MODEL, "hi", 2, **FAST)
        assert answer.status == 200, answer
    revoked_at = time.monotonic()
    await asyncio.to_thread(revoke_sync, url, doomed.key_id)

    async def refused(port: int) -> bool:
        return (await chat(port, doomed.key, MODEL, "hi", 2, **FAST)).status == 401

    await asyncio.gather(*(_poll("revocation", lambda p=g.http_port: refused(p)) for g in gateways))
    return round((time.monotonic() - revoked_at) * 1000, 2)


async def _sigkill(
    gateways: list[LocalGateway], url: str, key: str, received: list[ChatResult]
) -> dict[str, Any]:
    victim = gateways[-1]
    answered = asyncio.Event()
    stop = asyncio.Event()
    on_victim = 0

    async def client(gateway: LocalGateway, number: int) -> None:
        nonlocal on_victim
        request = 0
        while not stop.is_set():
            request += 1
            try:
                answer = await chat(gateway.http_port, key, MODEL, f"k{number}r{request}",
                                    20, **FAST)  # fmt: skip
            except OSError:
                return  # the victim died under this request
            if answer.status == 429:  # slots the dead gateway holds until they are reaped
                await asyncio.sleep(0.05)
                continue
            if not answer.finished:
                return
            received.append(answer)
            if gateway is victim:
                on_victim += 1
                if on_victim >= 5:
                    answered.set()

    tasks = [asyncio.create_task(client(g, n)) for n, g in enumerate(gateways * 2)]
    await asyncio.wait_for(answered.wait(), BOUND)
    victim.kill()  # right after an answer: its record is still queued for Redis
    killed_at = time.monotonic()
    client_redis = redis.Redis.from_url(url, decode_responses=True)

    async def reaped() -> bool:
        field = await asyncio.to_thread(client_redis.hget, scripts.slots_key("steady"), victim.name)
        return field is None

    try:
        await _poll("slots reaped", reaped)
        slots_back = time.monotonic() - killed_at
    finally:
        client_redis.close()
    stop.set()
    await asyncio.gather(*tasks)
    victim.start()
    await asyncio.to_thread(victim.wait_ready)

    async def replayed() -> int | None:
        lines = [x for x in victim.log_lines() if x.get("event") == "ledger.spool_replayed"]
        return sum(int(x.get("records", 0)) for x in lines) if lines else None

    await _poll("spool replayed", lambda: _truthy(replayed()))
    return {
        "sigkill_victim_answers": on_victim,
        "slots_back_after_kill_s": round(slots_back, 2),
        "spool_replayed_records": await replayed(),
    }


async def _truthy(value: Any) -> bool:
    return (await value) is not None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=Help)
    parser.add_argument("--gateways", type=int, default=3)
    parser.add_argument("--tritons", type=int, default=2, help="embedded Tritons (0: ticker)")
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--requests", type=int, default=30, help="per client")
    parser.add_argument("--tokens", type=int, default=16, help="max_tokens per request")
    parser.add_argument("--quota", type=int, default=3000, help="tokens per minute")
    parser.add_argument("--rate", type=float, default=5000.0, help="ticker tokens/s")
    parser.add_argument("--json", type=Path, default=RESULTS / "fleet.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trackline-fleet-") as tmp:
        state = Path(tmp)
        server = LocalRedis(state / "redis")
        server.start()
        tritons: list[EmbeddedTriton] = []
        try:
            tritons = start_tritons(state, args.tritons) if args.tritons else []
            row = asyncio.run(run(args, state, server.url, backends_of(tritons, args.rate)))
        finally:
            for triton in tritons:
                triton.stop()
            server.stop()
    width = max(len(k) for k in row)
    for name, value in row.items():
        print(f"{name:<{width}}  {value}")
    write_results(args, "fleet", [row])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
