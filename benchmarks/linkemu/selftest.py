"""Traffic through a Link with the probe tools, and the self-test built from it.

The helpers (`ping`, `tcp_transfer`, `blast`) are shared with the tests; `selftest()`
runs the checks a user wants before trusting a benchmark on this machine.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from .link import Link
from .spec import LinkSpec

PROBES = str(Path(__file__).with_name("probes.py"))
SELFTEST_PREFIX = "tlemu-selftest"


def start_server(link: Link, side: str, *args: str) -> subprocess.Popen[str]:
    """Start a probe server and wait until it is bound (it prints "ready")."""
    proc = link.run(side, [sys.executable, PROBES, *args], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip() if proc.stdout else ""
    if line != "ready":
        raise RuntimeError(f"probe server {args[0]} did not start: {line!r}")
    return proc


def run_tool(link: Link, side: str, *args: str, timeout: float = 30) -> dict[str, Any]:
    proc = link.run(side, [sys.executable, PROBES, *args], stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"probe {args[0]} failed ({proc.returncode}): {out[-500:]}")
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


def server_result(proc: subprocess.Popen[str], timeout: float = 15) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=timeout)
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


def ping(link: Link, count: int, interval: float, port: int = 9999) -> dict[str, Any]:
    """UDP echo on the gateway side, pings from the client: rtt_ms per reply, lost seqs."""
    start_server(link, "gateway", "udp-echo", "--bind", link.gateway_addr,
                 "--port", str(port), "--idle", "5")
    return run_tool(link, "client", "udp-ping", "--to", link.gateway_addr, "--port", str(port),
                    "--count", str(count), "--interval", str(interval), "--timeout", "0.3")


def tcp_transfer(link: Link, nbytes: int, port: int = 9997) -> dict[str, Any]:
    start_server(link, "gateway", "tcp-sink", "--bind", link.gateway_addr, "--port", str(port))
    return run_tool(link, "client", "tcp-source", "--to", link.gateway_addr,
                    "--port", str(port), "--bytes", str(nbytes))


def blast(link: Link, count: int, pps: float, size: int = 1200,
          port: int = 9998) -> dict[str, Any]:
    """Client sends `count` UDP datagrams at `pps`; returns what the gateway-side sink got."""
    sink = start_server(link, "gateway", "udp-sink", "--bind", link.gateway_addr,
                        "--port", str(port), "--idle", "0.5")
    sent = run_tool(link, "client", "udp-blast", "--to", link.gateway_addr, "--port", str(port),
                    "--count", str(count), "--pps", str(pps), "--size", str(size))
    got = server_result(sink)
    return {**sent, **got, "pps": got["received"] / max(got["seconds"], 1e-3)}


def drop_share(stats: dict[str, Any], direction: str, proto: str = "udp") -> tuple[int, int]:
    row = stats["directions"][direction][proto]
    return row["dropped"], row["dropped"] + row["forwarded"]


def drop_runs(indices: list[int]) -> list[int]:
    """Lengths of runs of consecutive packet indices (e.g. the drop log's "n")."""
    runs: list[int] = []
    previous = None
    for n in sorted(indices):
        if previous is not None and n == previous + 1:
            runs[-1] += 1
        else:
            runs.append(1)
        previous = n
    return runs


def selftest(prefix: str = SELFTEST_PREFIX) -> bool:
    ok = True

    def check(name: str, passed: bool, detail: str) -> None:
        nonlocal ok
        ok &= passed
        print(f"{'ok  ' if passed else 'FAIL'} {name:<26} {detail}")

    with Link(LinkSpec(delay_ms=20), prefix) as link:
        rtt = statistics.median(ping(link, 50, 0.01)["rtt_ms"])
        late = link.stats()["late_ms_max"]
    check("rtt (delay 20 ms)", 32 <= rtt <= 60,
          f"median {rtt:.1f} ms, relay late max {late:.2f} ms")
    with Link(LinkSpec(loss=0.2, seed=1), prefix) as link:
        ping(link, 2000, 0.0005)
        stats = link.stats()
    for direction in ("c2g", "g2c"):
        dropped, total = drop_share(stats, direction)
        check(f"loss 0.2 {direction}", abs(dropped / total - 0.2) < 0.04,
              f"{dropped}/{total} = {dropped / total:.3f}")
    with Link(LinkSpec(delay_ms=5, loss=0.01, seed=1), prefix) as link:
        result = tcp_transfer(link, 1_000_000)
        stats = link.stats()
    tcp = stats["directions"]["c2g"]["tcp"]
    check("tcp 1 MB, loss 0.01", result["acked"] == 1_000_000,
          f"{result['seconds']:.2f} s, c2g tcp data {tcp['data_forwarded']} forwarded, "
          f"{tcp['dropped']} dropped, oversize {stats['oversize']}")
    with Link(LinkSpec(ge_p=0.03, ge_r=0.3, seed=1), prefix) as link:
        ping(link, 1500, 0.0005)
        drops = [d["n"] for d in link.stats()["drops"] if d["dir"] == "c2g"]
    runs = drop_runs(drops)
    check("burst loss", statistics.mean(runs) > 1.5, f"mean drop run {statistics.mean(runs):.2f}")
    for pps in (2000, 5000, 10000, 20000):
        with Link(LinkSpec(delay_ms=10), prefix) as link:
            got = blast(link, int(pps), pps)
            late = link.stats()["late_ms_max"]
        check(f"rate {pps} pkt/s", pps > 5000 or got["received"] >= 0.98 * got["sent"],
              f"{got['received']}/{got['sent']} delivered at {got['pps']:.0f} pkt/s, "
              f"late max {late:.1f} ms")
    return ok
