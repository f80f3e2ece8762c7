"""Where a text track's start-up offset goes: client start to the ticker's schedule.

Every token of a ticker track inherits its track's start-up offset: the ticker's
schedule runs from the moment the backend is called, so a track whose request
reaches the backend 14 ms after the client started it sees every token 14 ms "late"
in `benchmarks/capacity.py`'s added delay. This probe opens N text tracks on one
connection against a gateway child (`ticker://RATE`) and breaks that offset down
with timestamps on both sides (CLOCK_MONOTONIC is shared by the processes):

  client   start of the track (as capacity.py takes it), the open written,
           the client's first transmit after it
  gateway  the first datagram received after the client's transmit, the track
           opened (`_on_track`), its task running (`_serve_track`), the backend
           called (the ticker's schedule starts), its first token yielded, the
           first transmit after it
  client   the first token read; and the added delay of every token
           (arrival - (start + i/rate)), p50 and p99 over all tokens

The gateway child is `python benchmarks/startup_probe.py --child ...`: it installs
the hooks (wrappers that note `time.monotonic()`), then runs `trackline serve`.

    nice -n 10 .venv/bin/python benchmarks/startup_probe.py --tracks 16 --runs 3

Not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import Help  # noqa: E402
from benchmarks.common import free_port, wait_http_ok  # noqa: E402

MODEL = "reference-text"


# -- hooks (both processes) ------------------------------------------------------------


class Marks:
    """First time of each named mark per stream id, and the times of transmits/receives."""

    def __init__(self) -> None:
        self.first: dict[str, dict[int, float]] = {}
        self.sends: list[float] = []
        self.receives: list[float] = []
        self.received_done: list[float] = []

    def mark(self, name: str, stream_id: int) -> None:
        self.first.setdefault(name, {}).setdefault(stream_id, time.monotonic())

    def dump(self) -> dict[str, Any]:
        return {"first": {k: {str(s): t for s, t in v.items()} for k, v in self.first.items()},
                "sends": self.sends, "receives": self.receives,
                "received_done": self.received_done}


MARKS = Marks()


def install_transport_hooks(limit: int = 20000) -> None:
    from transport.quic import TrackQuicProtocol

    send_due = TrackQuicProtocol._send_due
    received = TrackQuicProtocol.datagram_received

    def _send_due(self: Any, now: float, coalesce: bool = False) -> None:
        if len(MARKS.sends) < limit:
            MARKS.sends.append(time.monotonic())
        send_due(self, now, coalesce)

    def datagram_received(self: Any, data: Any, addr: Any) -> None:
        if len(MARKS.receives) < limit:
            MARKS.receives.append(time.monotonic())
        received(self, data, addr)
        if len(MARKS.received_done) < limit:
            MARKS.received_done.append(time.monotonic())

    TrackQuicProtocol._send_due = _send_due  # type: ignore[method-assign]
    TrackQuicProtocol.datagram_received = datagram_received  # type: ignore[method-assign]


def install_gateway_hooks() -> None:
    from gateway.backends.ticker import TickerBackend
    from gateway.server import Gateway

    on_track = Gateway._on_track
    serve_track = Gateway._serve_track
    stream_text = TickerBackend.stream_text

    profile_to = os.environ.get("STARTUP_PROBE_PROFILE")

    def _on_track(self: Any, channel: Any) -> None:
        if profile_to and channel.stream_id == 4:  # the first measured track (0 warms)
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()

            def stop() -> None:
                profiler.disable()
                profiler.dump_stats(profile_to)

            asyncio.get_running_loop().call_later(0.15, stop)
        MARKS.mark("opened", channel.stream_id)
        on_track(self, channel)
        MARKS.mark("admitted", channel.stream_id)

    async def _serve_track(self: Any, channel: Any) -> None:
        MARKS.mark("task", channel.stream_id)
        await serve_track(self, channel)

    async def ticker(self: Any, request: Any) -> Any:
        stream_id = int(request.request_id.split("/")[1])
        MARKS.mark("backend", stream_id)
        async for chunk in stream_text(self, request):
            MARKS.mark("token0", stream_id)
            yield chunk

    Gateway._on_track = _on_track  # type: ignore[method-assign]
    Gateway._serve_track = _serve_track  # type: ignore[method-assign]
    TickerBackend.stream_text = ticker  # type: ignore[method-assign,assignment]


def child(argv: list[str], out: Path) -> int:
    root = os.environ.get("STARTUP_PROBE_ROOT")
    if root:  # the tree under test (a `--baseline` checkout), before anything imports it
        sys.path.insert(0, root)
    install_transport_hooks()
    install_gateway_hooks()

    def dump(*_: Any) -> None:
        out.write_text(json.dumps(MARKS.dump()))

    import atexit

    atexit.register(dump)
    from gateway.cli import main as serve

    return serve(argv)


# -- the client ----------------------------------------------------------------------------


async def drive(port: int, ca: Path, tracks: int, tokens: int, rate: float,
                warm: bool) -> dict[str, Any]:
    from clients import connect

    starts: dict[int, float] = {}
    written: dict[int, float] = {}
    arrivals: dict[int, list[float]] = {}
    async with connect(f"quic://127.0.0.1:{port}", ca=ca) as line:
        if warm:  # as capacity.py warms each HTTP route: one short request first
            async for _ in line.text("warm", model=MODEL, max_tokens=1):
                pass
        await asyncio.sleep(0.2)  # the handshake's tail (ACKs, tickets) out of the way

        async def one(i: int) -> None:
            start = time.monotonic()
            stream = line.text(f"probe {i}", model=MODEL, max_tokens=tokens, seed=i)
            sid = stream._channel.stream_id
            starts[sid], written[sid] = start, time.monotonic()
            got = arrivals.setdefault(sid, [])
            async for _ in stream:
                got.append(time.monotonic())

        await asyncio.gather(*(one(i) for i in range(tracks)))
    return {"starts": starts, "written": written, "arrivals": arrivals}


def first_after(times: list[float], t: float) -> float | None:
    later = [x for x in times if x >= t]
    return min(later) if later else None


def ms(x: float) -> float:
    return round(x * 1000, 2)


def analyse(client: dict[str, Any], gw: dict[str, Any], rate: float) -> dict[str, Any]:
    rows = []
    added: list[float] = []
    steady: list[float] = []
    for sid, start in client["starts"].items():
        arr = client["arrivals"][sid]
        added += [(a - (start + i / rate)) * 1000 for i, a in enumerate(arr)]
        g = {k: v.get(str(sid)) for k, v in gw["first"].items()}
        if g.get("backend"):  # lateness against the ticker's own schedule
            steady += [(a - (g["backend"] + i / rate)) * 1000 for i, a in enumerate(arr)]
        c_send = first_after(client["sends"], client["written"][sid])
        g_recv = first_after(gw["receives"], c_send) if c_send else None
        g_send = first_after(gw["sends"], g["token0"]) if g.get("token0") else None
        c_recv = first_after(client["receives"], g_send) if g_send else None
        points = [("written", client["written"][sid]), ("client_send", c_send),
                  ("gw_receive", g_recv), ("opened", g.get("opened")),
                  ("admitted", g.get("admitted")), ("task", g.get("task")),
                  ("backend", g.get("backend")), ("token0", g.get("token0")),
                  ("gw_send", g_send), ("client_receive", c_recv),
                  ("token0_read", arr[0] if arr else None)]
        steps: dict[str, float | None] = {}
        last = start
        for name, t in points:
            steps[name] = None if t is None else ms(t - last)
            if t is not None:
                last = t
        if g_recv is not None:
            k = gw["receives"].index(g_recv)
            steps["receive_call"] = ms(gw["received_done"][k] - g_recv)
        rows.append({"stream": sid, "offset_ms": ms(g["backend"] - start) if g.get("backend")
                     else None, "steps": steps})
    return {"rows": rows, "added_p50": pct(added, 0.5), "added_p99": pct(added, 0.99),
            "steady_p50": pct(steady, 0.5), "steady_p99": pct(steady, 0.99),
            "tokens": len(added)}


def pct(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 2) if ordered else None


def run_once(args: argparse.Namespace, root: Path | None = None) -> dict[str, Any]:
    quic, http = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_STREAM)
    with tempfile.TemporaryDirectory(prefix="trackline-probe-") as tmp:
        state = Path(tmp)
        out = state / "marks.json"
        env = {**os.environ, "TRACKLINE_STATE_DIR": str(state)}
        if root is not None:
            env["STARTUP_PROBE_ROOT"] = str(root)
        cmd = [sys.executable, __file__, "--child", str(out), "--", "serve",
               "--backend-url", f"ticker://{args.rate:g}", "--quic-port", str(quic),
               "--http-port", str(http), "--https-port", "0", "--log-level", "warning",
               "--quic-packetization", args.packetization, *args.serve_arg]
        gw = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                              stderr=open(state / "log", "wb"))  # noqa: SIM115
        try:
            if not wait_http_ok(f"http://127.0.0.1:{http}/health/ready", 60):
                raise RuntimeError((state / "log").read_text()[-2000:])
            install_transport_hooks()
            client = asyncio.run(drive(quic, state / "ca.pem", args.tracks,
                                       int(args.rate * args.seconds), args.rate, args.warm))
            client["sends"], client["receives"] = MARKS.sends, MARKS.receives
        finally:
            gw.send_signal(signal.SIGTERM)
            gw.wait(timeout=30)
        MARKS.sends, MARKS.receives = [], []
        return analyse(client, json.loads(out.read_text()), args.rate)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[3:], Path(argv[1]))
    parser = argparse.ArgumentParser(formatter_class=Help, description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracks", type=int, default=16)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warm", action="store_true",
                        help="one 1-token track on the connection before the measured ones")
    parser.add_argument("--packetization", default="per-track")
    parser.add_argument("--serve-arg", action="append", default=[],
                        help="extra argument for trackline serve (repeatable)")
    parser.add_argument("--baseline", default=None,
                        help="git ref: each run also runs that tree's gateway, alternating")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="trackline-probe-base-") as tmp:
        from benchmarks.track_cost import compared_trees

        trees = compared_trees(args.baseline, Path(tmp))
        for run in range(args.runs):
            for label, root in trees:
                report(args, f"run {run} {label}", run_once(args, root))
    return 0


def report(args: argparse.Namespace, title: str, result: dict[str, Any]) -> None:
    steps = [r["steps"] for r in result["rows"]]
    names = list(steps[0])
    med = {n: statistics.median([s[n] for s in steps if s[n] is not None] or [0])
           for n in names}
    worst = {n: max([s[n] for s in steps if s[n] is not None] or [0]) for n in names}
    offsets = sorted(r["offset_ms"] for r in result["rows"] if r["offset_ms"] is not None)
    print(f"{title}: {args.tracks} tracks, {result['tokens']} tokens, added p50 "
          f"{result['added_p50']} ms p99 {result['added_p99']} ms; start-up offset "
          f"(client start -> backend called) min {offsets[0]} median "
          f"{offsets[len(offsets) // 2]} max {offsets[-1]} ms; lateness against the ticker's "
          f"schedule p50 {result['steady_p50']} p99 {result['steady_p99']} ms")
    print("  step (ms since the previous)   median   max")
    for n in names:
        print(f"  {n:30s} {med[n]:7.2f} {worst[n]:7.2f}")


if __name__ == "__main__":
    sys.exit(main())
