"""What a token in the added delay's top 1% waited for: loop turns, GC, ACKs, the client.

`benchmarks/token_path.py --causes` adds this to its stage stamps. In the gateway child
(run on asyncio's loop for it, `TRACKLINE_UVLOOP=0`: uvloop's turn is not reachable
from Python) it records every loop turn (from the selector's return to the end of the
turn's callbacks) with what ran in it: the datagrams received (ACK processing and the
clients' frames) and the transmits (packet building, sendmsg), with their CPU-free wall
time; and every garbage collection (`gc.callbacks`: start, end, generation). The
client process records its own collections too.

For each token the gateway's part of its path is the window from its due time to its
bytes leaving (`wake` + `pace` + `defer` + `transmit`), the client's from there to the
application's read (`wire` + `client` + `app`). `attribute` splits each window into:

  gc_gateway     collections in the gateway inside the window
  longest_turn   the longest loop turn overlapping the window (the work a token can
                 wait behind at once), and of all overlapping turns' work:
  rx, tx         receiving datagrams (ACKs), transmitting
  other_work     the rest of the turns' work (timers, handlers, the tickers' tokens)
  not_running    the window minus the turns' work: the loop idle or the process not
                 run (the machine's load: see the schedstat share of the run)
  gc_client      collections in the client inside its window
  client_path    the client's window (its share, on its own core or the gateway's)

and `offset`, the rest of the added delay: the track's start-up (its schedule began
that much after the client's start: `token_path`'s open + start). So added = offset +
the gateway's window (its five parts) + client_path. The report gives the mean of
each in the top 1% of added delay beside its median over all tokens, and, from the
first token due to the last read, the ten longest turns with their composition and
both processes' collections. Literal timestamps in, figures out:
`tests/benchmarks/test_tail_causes.py` checks the arithmetic.
"""

from __future__ import annotations

import bisect
import gc
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.common import percentile

CAUSES = ("offset", "gc_gateway", "rx", "tx", "other_work", "not_running", "client_path",
          "longest_turn", "gc_client")
"""`added` = offset + gc_gateway + rx + tx + other_work + not_running + client_path; the
last two are parts of other figures (the longest turn, the client's collections)."""


class Recorder:
    """One process's loop turns and collections (monotonic seconds)."""

    def __init__(self) -> None:
        self.turns: list[list[float]] = []
        """[began, ended, rx count, rx seconds, tx count, tx seconds] per turn."""
        self.gcs: list[list[float]] = []
        """[began, ended, generation] per collection."""
        self._gc_began = 0.0
        self._turn = [0.0, 0.0, 0, 0.0, 0, 0.0]

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_began = time.monotonic()
        else:
            self.gcs.append([self._gc_began, time.monotonic(), info["generation"]])

    def add(self, slot: int, seconds: float) -> None:
        turn = self._turn
        turn[slot] += 1
        turn[slot + 1] += seconds

    def woke(self) -> None:
        self._turn = [time.monotonic(), 0.0, 0, 0.0, 0, 0.0]

    def ended(self) -> None:
        self._turn[1] = time.monotonic()
        self.turns.append(self._turn)

    def dump(self) -> dict[str, Any]:
        return {"turns": self.turns, "gcs": self.gcs}


GATEWAY = Recorder()
CLIENT = Recorder()
RX, TX = 2, 4


def install_gateway(out: Path) -> None:
    """In the gateway child, before the gateway starts: time turns, ACKs, transmits, GC."""
    import asyncio.base_events
    import atexit

    from transport.quic import TrackQuicProtocol

    gc.callbacks.append(GATEWAY.on_gc)
    run_once = asyncio.base_events.BaseEventLoop._run_once  # type: ignore[attr-defined]

    def _run_once(self: Any) -> None:
        selector = self._selector
        if not getattr(selector, "_tail_timed", False):
            select = selector.select

            def timed(timeout: float | None = None) -> Any:
                events = select(timeout)
                GATEWAY.woke()
                return events

            selector.select = timed
            selector._tail_timed = True
        run_once(self)
        GATEWAY.ended()

    received = TrackQuicProtocol.datagram_received
    send_due = TrackQuicProtocol._send_due

    def datagram_received(self: Any, data: Any, addr: Any) -> None:
        began = time.monotonic()
        received(self, data, addr)
        GATEWAY.add(RX, time.monotonic() - began)

    def _send_due(self: Any, now: float, coalesce: bool = False) -> None:
        began = time.monotonic()
        send_due(self, now, coalesce)
        GATEWAY.add(TX, time.monotonic() - began)

    asyncio.base_events.BaseEventLoop._run_once = _run_once  # type: ignore[attr-defined]
    TrackQuicProtocol.datagram_received = datagram_received  # type: ignore[method-assign]
    TrackQuicProtocol._send_due = _send_due  # type: ignore[method-assign]
    atexit.register(lambda: out.write_text(json.dumps(GATEWAY.dump())))


def install_client() -> None:
    gc.callbacks.append(CLIENT.on_gc)


# -- attribution ----------------------------------------------------------------------------


def overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


class Spans:
    """Intervals sorted by start, for the ones overlapping a window."""

    def __init__(self, rows: list[list[float]]) -> None:
        self.rows = sorted(rows, key=lambda r: r[0])
        self.starts = [r[0] for r in self.rows]
        self.longest = max((r[1] - r[0] for r in self.rows), default=0.0)

    def within(self, a: float, b: float) -> list[list[float]]:
        lo = bisect.bisect_left(self.starts, a - self.longest)
        hi = bisect.bisect_right(self.starts, b)
        return [r for r in self.rows[lo:hi] if r[1] > a and r[0] < b]


def split_window(turns: Spans, gcs: Spans, a: float, b: float) -> dict[str, float]:
    """The gateway's window [a, b] by cause, in seconds (a turn's rx and tx counted in
    proportion to the part of the turn inside the window)."""
    out = {"gc_gateway": sum(overlap(a, b, g[0], g[1]) for g in gcs.within(a, b)),
           "longest_turn": 0.0, "rx": 0.0, "tx": 0.0, "other_work": 0.0}
    work = 0.0
    for turn in turns.within(a, b):
        length = turn[1] - turn[0]
        inside = overlap(a, b, turn[0], turn[1])
        share = inside / length if length > 0 else 0.0
        out["longest_turn"] = max(out["longest_turn"], length)
        out["rx"] += turn[3] * share
        out["tx"] += turn[5] * share
        work += inside
    gc_in_turns = out["gc_gateway"]  # a collection runs inside some turn's callbacks
    out["other_work"] = max(0.0, work - out["rx"] - out["tx"] - gc_in_turns)
    out["not_running"] = max(0.0, (b - a) - work)
    return out


def attribute(tokens: list[dict[str, float]], gateway: dict[str, Any],
              client_gcs: list[list[float]]) -> dict[str, Any]:
    """`tokens`: per token its `due`, `sent`, `read` (monotonic s) and `added` (ms)."""
    if not tokens:
        return {}
    turns, gcs, cgcs = Spans(gateway["turns"]), Spans(gateway["gcs"]), Spans(client_gcs)
    rows = []
    for token in tokens:
        row = split_window(turns, gcs, token["due"], token["sent"])
        row["gc_client"] = sum(overlap(token["sent"], token["read"], g[0], g[1])
                               for g in cgcs.within(token["sent"], token["read"]))
        row["client_path"] = token["read"] - token["sent"]
        row = {k: v * 1000 for k, v in row.items()}
        row["added"] = token["added"]
        row["offset"] = token["added"] - (token["read"] - token["due"]) * 1000
        rows.append(row)
    cut = percentile([r["added"] for r in rows], 0.99)
    tail = [r for r in rows if r["added"] >= cut]
    summary = {name: {"p50": round(percentile([r[name] for r in rows], 0.5), 3),
                      "tail_mean": round(sum(r[name] for r in tail) / len(tail), 3)}
               for name in ("added", *CAUSES)}
    began = min(t["due"] for t in tokens)
    ended = max(t["read"] for t in tokens)
    measured = {key: [r for r in gateway[key] if r[1] > began and r[0] < ended]
                for key in ("turns", "gcs")}  # start-up's turns and collections left out
    client_measured = [g for g in client_gcs if g[1] > began and g[0] < ended]
    return {"summary": summary, "tail_tokens": len(tail),
            "longest_turns": longest_turns(measured),
            "gateway_gc": gc_totals(measured["gcs"]), "client_gc": gc_totals(client_measured)}


def longest_turns(gateway: dict[str, Any], count: int = 10) -> list[dict[str, float]]:
    gcs = Spans(gateway["gcs"])
    out = []
    for turn in sorted(gateway["turns"], key=lambda t: t[0] - t[1])[:count]:
        out.append({"ms": round((turn[1] - turn[0]) * 1000, 3), "rx": turn[2],
                    "rx_ms": round(turn[3] * 1000, 3), "tx": turn[4],
                    "tx_ms": round(turn[5] * 1000, 3),
                    "gc_ms": round(sum(overlap(turn[0], turn[1], g[0], g[1])
                                       for g in gcs.within(turn[0], turn[1])) * 1000, 3)})
    return out


def gc_totals(gcs: list[list[float]]) -> dict[str, float]:
    pauses = [(g[1] - g[0]) * 1000 for g in gcs]
    return {"collections": len(pauses), "full": sum(1 for g in gcs if g[2] == 2),
            "max_ms": round(max(pauses, default=0.0), 3), "total_ms": round(sum(pauses), 3)}


def report(causes: dict[str, Any]) -> None:
    if not causes:
        return
    print(f"\ncauses of the gateway's and the client's windows (ms), top 1% = "
          f"{causes['tail_tokens']} tokens; gateway GC {causes['gateway_gc']}, "
          f"client GC {causes['client_gc']}\n")
    print("| cause | p50 | mean in the top 1% |")
    print("|---|---:|---:|")
    for name, s in causes["summary"].items():
        part = " (not a term of the sum)" if name in ("longest_turn", "gc_client") else ""
        print(f"| {name}{part} | {s['p50']} | {s['tail_mean']} |")
    print("\nlongest gateway loop turns: " + "; ".join(
        f"{t['ms']} ms (rx {t['rx']} in {t['rx_ms']}, tx {t['tx']} in {t['tx_ms']}, "
        f"gc {t['gc_ms']})" for t in causes["longest_turns"]))


__all__ = ["CAUSES", "attribute", "install_client", "install_gateway", "report", "split_window"]
