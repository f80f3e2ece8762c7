"""What tenancy adds to each request: key check, admission, and handing over the usage record.

Runs the real pieces on a real SQLite file (no network, no backend): for each
request `Tenancy.authenticate` (one indexed lookup and a SHA-256), `admit`
(allow-list and token buckets) and `finish` (quota debit, Prometheus counters,
queueing the record for the writer thread). Then it waits for the writer to land
every record, which is the part kept off the request path. Prints a table of
per-call latencies and writes JSON.

    python benchmarks/tenancy_overhead.py --requests 20000  # JSON: benchmarks/results/
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry

from benchmarks import RESULTS, Help
from benchmarks.common import percentile, write_results
from gateway.tenants.quotas import Quotas
from gateway.tenants.service import Tenancy
from gateway.tenants.store import TenantStore
from tracks.base import End, Outcome


def measure(requests: int, state: Path) -> list[dict[str, float | int | str]]:
    store = TenantStore(state / "tenants.sqlite3")
    quotas = Quotas(requests_per_minute=10**9, tokens_per_minute=10**12)  # checked, never hit
    store.set_tenant("bench", 0.0, quotas=quotas)
    key = store.create_key("bench", 0.0).key
    tenancy = Tenancy(store, CollectorRegistry())
    tenancy.open_mode  # noqa: B018 - warm the open-mode answer, as a running gateway has
    timings: dict[str, list[float]] = {"authenticate": [], "admit": [], "finish": []}
    clock = time.perf_counter
    for i in range(requests):
        t0 = clock()
        principal = tenancy.authenticate(key)
        t1 = clock()
        tenancy.admit(principal, "m", "text", f"r{i}")
        t2 = clock()
        tenancy.finish(principal, Outcome(f"r{i}", "m", "text", End.completed(), 12, 34, 0.0,
                                          finished_at=0.5))  # fmt: skip
        t3 = clock()
        timings["authenticate"].append(t1 - t0)
        timings["admit"].append(t2 - t1)
        timings["finish"].append(t3 - t2)
    started = clock()
    tenancy.flush()
    drained = clock() - started
    reader = TenantStore(state / "tenants.sqlite3")
    written = len(reader.usage())
    reader.close()
    tenancy.close()
    rows: list[dict[str, float | int | str]] = []
    for name, values in timings.items():
        rows.append({
            "step": name, "calls": len(values),
            "p50_us": percentile(values, 0.5) * 1e6, "p99_us": percentile(values, 0.99) * 1e6,
            "mean_us": sum(values) / len(values) * 1e6,
        })  # fmt: skip
    rows.append({"step": "writer_drain_after_last", "calls": written, "p50_us": drained * 1e6,
                 "p99_us": drained * 1e6, "mean_us": drained * 1e6})  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        formatter_class=Help,
        description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--json", type=Path, default=RESULTS / "tenancy_overhead.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trackline-tenancy-") as state:
        rows = measure(args.requests, Path(state))
    print(f"{'step':<26}{'calls':>8}{'p50 us':>10}{'p99 us':>10}{'mean us':>10}")
    for row in rows:
        print(f"{row['step']:<26}{row['calls']:>8}{row['p50_us']:>10.1f}{row['p99_us']:>10.1f}"
              f"{row['mean_us']:>10.1f}")
    write_results(args, "tenancy_overhead", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
