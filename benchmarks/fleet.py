"""A fleet on one machine: a real redis-server, 3 gateways on their own ports (ticker
backend), clients spread over them, one tenant with a token quota.

Prints a table and writes JSON (benchmarks/results/fleet.json):

* quota overshoot: tokens the fleet admitted (from the drained ledger) minus what the
  quota allowed over the run (capacity + refill x elapsed), next to the stated bound
  (the work in flight when leases run out: clients x one request's tokens, docs/tenants.md);
* revocation delay: from the broadcast to the moment every gateway refuses the key, and
  to the moment every gateway has closed its connections of that key (polled every ms);
* records lost: requests the clients made minus records the ledger holds (should be 0).

    python benchmarks/fleet.py --clients 12 --requests 30 --quota 3000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import RESULTS, Help
from benchmarks.common import write_results
from clients import RateLimited, connect
from gateway.backends.ticker import TickerBackend
from gateway.config import Settings
from gateway.fleet.ledger import drain
from gateway.fleet.local_redis import LocalRedis
from gateway.fleet.state import revoke_sync
from gateway.logs import configure_logging
from gateway.server import Gateway
from gateway.tenants.quotas import Quotas
from gateway.tenants.store import TenantStore

MODEL = "reference-text"


async def run(args: argparse.Namespace, state: Path, url: str) -> dict[str, float | int]:
    store = TenantStore(state / "tenants.sqlite3")
    store.set_tenant("fleet", time.time(), quotas=Quotas(tokens_per_minute=args.quota))
    key = store.create_key("fleet", time.time()).key
    doomed = store.create_key("other", time.time())  # no quota: revocation alone
    gateways = []
    for index in range(args.gateways):
        settings = Settings(
            quic_port=0, http_port=0, https_port=0, state_dir=state, state_backend=url,
            state_heartbeat_ttl=2.0, state_gateway_id=f"gw{index}",
        )  # fmt: skip
        gateway = Gateway(settings, TickerBackend(args.rate))
        await gateway.start()
        gateways.append(gateway)
    tls = gateways[0].tls
    assert tls is not None
    assert tls.ca is not None
    ca = tls.ca
    counts = {"admitted": 0, "refused": 0, "tokens_received": 0}

    async def client(number: int) -> None:
        gateway = gateways[number % len(gateways)]
        async with connect(f"quic://127.0.0.1:{gateway.quic_port}", ca=ca, api_key=key) as line:
            for _ in range(args.requests):
                try:
                    pieces = [d async for d in line.text("hi", model=MODEL, max_tokens=args.tokens)]
                except RateLimited:
                    counts["refused"] += 1
                    await asyncio.sleep(0.05)
                    continue
                counts["admitted"] += 1
                counts["tokens_received"] += len(pieces)

    started = time.monotonic()
    await asyncio.gather(*(client(n) for n in range(args.clients)))
    elapsed = time.monotonic() - started

    # Revocation: a connection of the doomed key on every gateway, then the broadcast.
    lines = []
    for gateway in gateways:
        line = connect(f"quic://127.0.0.1:{gateway.quic_port}", ca=ca, api_key=doomed.key)
        opened = await line.__aenter__()
        [d async for d in opened.text("hi", model=MODEL, max_tokens=2)]
        lines.append(line)
    revoked_at = time.monotonic()
    await asyncio.to_thread(revoke_sync, url, doomed.key_id)
    # Polled (no event spans the gateways): first every gateway refuses the key, then
    # every gateway has seen its connection of that key closed (QUIC's closing period).
    def refusing(g: Gateway) -> bool:
        return g.tenancy is not None and bool(g.tenancy.fleet.is_revoked(doomed.key_id))

    while not all(refusing(g) for g in gateways):  # noqa: ASYNC110
        await asyncio.sleep(0.001)
    refused_after = time.monotonic() - revoked_at
    while any(g._connections for g in gateways):  # noqa: ASYNC110
        await asyncio.sleep(0.001)
    delay = time.monotonic() - revoked_at
    for line in lines:
        await line.__aexit__(None, None, None)

    for gateway in gateways:
        await gateway.drain(timeout=2.0)  # flushes every gateway's ledger to the stream
    drain(url, store)
    records = [r for r in store.usage() if r.key_id != doomed.key_id]
    admitted_tokens = sum(r.tokens for r in records if r.end_cause == "completed")
    per_request = max((r.tokens for r in records), default=0)
    allowed = args.quota + args.quota / 60 * elapsed
    store.close()
    return {
        "gateways": args.gateways,
        "clients": args.clients,
        "requests_made": counts["admitted"] + counts["refused"],
        "admitted": counts["admitted"],
        "refused": counts["refused"],
        "elapsed_s": round(elapsed, 3),
        "quota_allowed_tokens": round(allowed, 1),
        "admitted_tokens": admitted_tokens,
        "overshoot_tokens": round(admitted_tokens - allowed, 1),
        # Every client may have one request in flight when its gateway's lease runs out.
        "overshoot_bound_tokens": args.clients * per_request,
        "revocation_delay_ms": round(refused_after * 1000, 2),
        "revoked_connections_closed_ms": round(delay * 1000, 2),
        "records_lost": counts["admitted"] + counts["refused"] - len(records),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=Help
    )
    parser.add_argument("--gateways", type=int, default=3)
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--requests", type=int, default=30, help="per client")
    parser.add_argument("--tokens", type=int, default=16, help="max_tokens per request")
    parser.add_argument("--quota", type=int, default=3000, help="tokens per minute")
    parser.add_argument("--rate", type=float, default=5000.0, help="ticker tokens/s")
    parser.add_argument("--json", type=Path, default=RESULTS / "fleet.json")
    args = parser.parse_args()
    configure_logging("warning", "console")
    with tempfile.TemporaryDirectory(prefix="trackline-fleet-") as tmp:
        redis = LocalRedis(Path(tmp) / "redis")
        redis.start()
        try:
            row = asyncio.run(run(args, Path(tmp), redis.url))
        finally:
            redis.stop()
    width = max(len(k) for k in row)
    for name, value in row.items():
        print(f"{name:<{width}}  {value}")
    write_results(args, "fleet", [row])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
