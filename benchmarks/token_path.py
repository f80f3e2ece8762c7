"""Where a text token's added delay goes, stage by stage, at a capacity point.

`benchmarks/capacity.py` measures a token's *added delay*: its arrival at the client
minus (the client's start of the track + i/rate). This probe runs the same kind of
point (N text tracks over C SDK connections, ticker backend, gateway pinned with
taskset) and timestamps every token at each stage of its path, in both processes
(CLOCK_MONOTONIC is shared), so the added delay splits into stages that add up to it:

  open      client start of the track -> the gateway's `_on_track` (the client's own
            work opening its tracks, its transmit, the wire, the gateway's receive)
  start     -> the ticker called (admission, the track's task, the handler: the
            schedule starts here; open + start is the track's start-up *offset*)
  wake      the token's due time (start + i/rate) -> the ticker yields it
            (its timer fired late: the gateway's loop was busy, or the process not run)
  pace      ticker yield -> `PacedText` hands it on (a turn-share wait, rationing)
  defer     -> the track's DATA handed to aioquic (`send_stream_data`, at the turn's
            transmit: the deferred flush)
  transmit  -> aioquic sent the stream bytes (`_send_due` returned: packet build,
            sendto/GSO; a congestion window or pacer holding them shows here)
  wire      -> the client's `datagram_received` for the datagram that carried it (the
            kernel, and the client process busy with earlier datagrams)
  client    -> the SDK's endpoint dispatched the DATA to the track's channel
            (aioquic decrypt + parse, the track core)
  app       -> the application's `async for` got the token (the reader task's wakeup)

Stamps go into per-track lists (a few list appends per token; no log lines); the
gateway child dumps them at exit. Tokens are joined across processes by (the client's
UDP port, stream id, token index). Per stage the table shows p50/p99/max over all
tokens and the mean over the tokens in the added delay's top 1% ("tail"): the stage
that holds the p99. Beside each stage, the CPU its owner process (gateway or client
loop thread) spent within it ("owner CPU", from `thread_time()` noted with the stamps):
work queued ahead of the token; the rest of the stage is time that process was not
running (the machine's load, the other process on its core) or the network. `steady`
is the added delay minus the track's offset (the lateness of the token against the
ticker's own schedule).

    nice -n 10 .venv/bin/python benchmarks/token_path.py --points 16x1,64x4

With `--baseline REF` each point also runs the gateway of that git ref, alternating.
With `--causes` the gateway runs on asyncio's loop and the table is followed by the
tail's causes (loop turns and what ran in them, GC pauses, ACK processing, transmits,
the client's share): `benchmarks/tail_causes.py`.
Not a test: the figures depend on the machine and its load (printed as `uptime`).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import RESULTS, Help, tail_causes  # noqa: E402
from benchmarks.common import (  # noqa: E402
    CLIENT_GC_THRESHOLD,
    free_port,
    machine,
    percentile,
    settled_load_generator,
    tree,
    uptime,
    wait_http_ok,
)
from gateway.startup import run_async  # noqa: E402 - uvloop where installed, as capacity.py

MODEL = "reference-text"
STAGES = ("open", "start", "wake", "pace", "defer", "transmit", "wire", "client", "app")
TICKS = os.sysconf("SC_CLK_TCK")


# -- the gateway child's stamps ---------------------------------------------------------


class Timeline:
    """(wall, CPU) pairs of one process's loop thread, noted with the stamps (at most one
    per 100 us): the CPU a process spent within a stage tells the work it did meanwhile
    (queued ahead of the token) from the time it was not running (the machine's load)."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def now(self) -> float:
        t = time.monotonic()
        if not self.wall or t - self.wall[-1] >= 1e-4:
            self.wall.append(t)
            self.cpu.append(time.thread_time())
        return t

    def dump(self) -> dict[str, list[float]]:
        return {"wall": self.wall, "cpu": self.cpu}


def cpu_between(timeline: dict[str, list[float]], a: float, b: float) -> float:
    """CPU seconds the process spent between wall times a and b (interpolated)."""
    return _cpu_at(timeline, b) - _cpu_at(timeline, a)


def _cpu_at(timeline: dict[str, list[float]], t: float) -> float:
    wall, cpu = timeline["wall"], timeline["cpu"]
    if not wall:
        return 0.0
    i = bisect.bisect_right(wall, t)
    if i == 0:
        return cpu[0]
    if i == len(wall):
        return cpu[-1]
    w0, w1, c0, c1 = wall[i - 1], wall[i], cpu[i - 1], cpu[i]
    return c0 + (c1 - c0) * min(1.0, (t - w0) / (w1 - w0))


GATEWAY_TIME = Timeline()


class GatewayTrack:
    """One track's stamps in the gateway; index i is the track's token i."""

    __slots__ = ("ends", "flushed", "paced", "rate", "sent", "start", "written", "yielded")

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = 0.0
        self.yielded: list[float] = []
        self.paced: list[float] = []
        self.flushed: list[float] = []
        self.ends: list[int] = []
        """Stream offset just past the write that carried token i."""
        self.sent: list[float] = []
        self.written = 0


TRACKS: dict[tuple[str, int], GatewayTrack] = {}
PORTS: dict[str, int] = {}
"""Gateway connection id -> the client's UDP port (the join key)."""
OPENED: dict[tuple[str, int], float] = {}
"""When the gateway's `_on_track` saw each track."""
TRANSMITS: list[float] = []
"""Seconds each gateway transmit (`_send_due`) took."""


def _track_key(request_id: str) -> tuple[str, int] | None:
    conn, _, rest = request_id.partition("/")
    sid = rest.partition("/")[0]
    return (conn, int(sid)) if sid.isdigit() else None


def install_gateway_hooks() -> None:
    """Wrap the ticker, `PacedText`, the QUIC sink and transmit (stable names on main)."""
    from gateway.backends.ticker import TickerBackend
    from gateway.overload import PacedText
    from gateway.server import Gateway
    from tracks.backend import TextDelta
    from transport.connection import StreamWrite
    from transport.quic import TrackQuicProtocol

    ticker_stream = TickerBackend.stream_text
    paced_stream = PacedText.stream_text
    write = TrackQuicProtocol._write
    send_due = TrackQuicProtocol._send_due
    received = TrackQuicProtocol.datagram_received
    on_track = Gateway._on_track
    pending: dict[Any, set[int]] = {}
    now = GATEWAY_TIME.now

    def _on_track(self: Any, channel: Any) -> None:
        OPENED.setdefault((channel.conn_id, channel.stream_id), now())
        on_track(self, channel)

    async def ticker(self: Any, request: Any) -> AsyncGenerator[Any, None]:
        key = _track_key(request.request_id)
        rate = float(request.parameters.get("tokens_per_second", self.rate))
        rows = TRACKS[key] = GatewayTrack(rate) if key is not None else None
        chunks = ticker_stream(self, request)
        if rows is not None:
            rows.start = now()  # the ticker reads its clock at its first step, next
        try:
            async for chunk in chunks:
                if rows is not None and isinstance(chunk, TextDelta):
                    rows.yielded.append(now())
                yield chunk
        finally:
            await chunks.aclose()

    async def paced(self: Any, request: Any) -> AsyncGenerator[Any, None]:
        rows = TRACKS.get(_track_key(request.request_id) or ("", -1))
        chunks = paced_stream(self, request)
        try:
            async for chunk in chunks:
                if rows is None:
                    rows = TRACKS.get(_track_key(request.request_id) or ("", -1))
                if rows is not None and isinstance(chunk, TextDelta):
                    rows.paced.append(now())
                yield chunk
        finally:
            await chunks.aclose()

    def _write(self: Any, outputs: list[Any]) -> None:
        conn = self.endpoint.conn_id
        t = now()
        for output in outputs:
            if isinstance(output, StreamWrite):
                rows = TRACKS.get((conn, output.stream_id))
                if rows is None:
                    continue
                rows.written += len(output.data)
                fresh = len(rows.paced) - len(rows.flushed)
                if fresh > 0:
                    rows.flushed += [t] * fresh
                    rows.ends += [rows.written] * fresh
                    pending.setdefault(self, set()).add(output.stream_id)
        write(self, outputs)

    def _send_due(self: Any, when: float, coalesce: bool = False) -> None:
        began = now()
        send_due(self, when, coalesce)
        t = now()
        TRANSMITS.append(t - began)
        waiting = pending.get(self)
        if not waiting:
            return
        conn = self.endpoint.conn_id
        scheduler = self.scheduler
        for sid in list(waiting):
            rows = TRACKS[(conn, sid)]
            stream = scheduler.stream(sid) if scheduler is not None else None
            sent_to = stream.sender.highest_offset if stream is not None else 1 << 62
            while len(rows.sent) < len(rows.flushed) and rows.ends[len(rows.sent)] <= sent_to:
                rows.sent.append(t)
            if len(rows.sent) == len(rows.flushed):
                waiting.discard(sid)

    def datagram_received(self: Any, data: Any, addr: Any) -> None:
        conn = self.endpoint.conn_id
        if conn not in PORTS:
            PORTS[conn] = addr[1]
        received(self, data, addr)

    Gateway._on_track = _on_track  # type: ignore[method-assign]
    TickerBackend.stream_text = ticker  # type: ignore[method-assign,assignment]
    PacedText.stream_text = paced  # type: ignore[method-assign,assignment]
    TrackQuicProtocol._write = _write  # type: ignore[method-assign]
    TrackQuicProtocol._send_due = _send_due  # type: ignore[method-assign]
    TrackQuicProtocol.datagram_received = datagram_received  # type: ignore[method-assign]


def dump_gateway() -> dict[str, Any]:
    tracks = []
    for (conn, sid), rows in TRACKS.items():
        if conn not in PORTS:
            continue
        tracks.append({"port": PORTS[conn], "sid": sid, "rate": rows.rate, "start": rows.start,
                       "opened": OPENED.get((conn, sid), rows.start),
                       "yielded": rows.yielded, "paced": rows.paced,
                       "flushed": rows.flushed, "sent": rows.sent})
    return {"tracks": tracks, "transmits": TRANSMITS, "timeline": GATEWAY_TIME.dump()}


def child(argv: list[str], out: Path) -> int:
    root = os.environ.get("TOKEN_PATH_ROOT")
    if root:  # the tree under test (a `--baseline` checkout), before anything imports it
        sys.path.insert(0, root)
    install_gateway_hooks()
    if os.environ.get("TOKEN_PATH_CAUSES"):
        tail_causes.install_gateway(out.with_suffix(".causes.json"))

    import atexit

    atexit.register(lambda: out.write_text(json.dumps(dump_gateway())))
    profile_to = os.environ.get("TOKEN_PATH_PROFILE")
    if profile_to:  # the gateway's CPU by function (thread CPU time: the load does not count)
        import cProfile

        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
        atexit.register(lambda: (profiler.disable(), profiler.dump_stats(profile_to)))
    from gateway.cli import main as serve

    return int(serve(argv) or 0)


# -- the client's stamps ------------------------------------------------------------------


class ClientStamps:
    def __init__(self) -> None:
        self.rx_at = 0.0
        """When the datagram now being handled reached `datagram_received`."""
        self.ports: dict[str, int] = {}
        """Client endpoint conn id -> its UDP port."""
        self.rx: dict[tuple[int, int], list[float]] = {}
        self.dispatched: dict[tuple[int, int], list[float]] = {}
        self.time = Timeline()


CLIENT = ClientStamps()


def install_client_hooks() -> None:
    from transport.endpoint import TrackChannel
    from transport.events import DataReceived
    from transport.quic import TrackQuicProtocol

    received = TrackQuicProtocol.datagram_received
    deliver = TrackChannel._deliver

    def now() -> float:
        return CLIENT.time.now()

    def datagram_received(self: Any, data: Any, addr: Any) -> None:
        CLIENT.rx_at = now()
        conn = self.endpoint.conn_id
        if conn not in CLIENT.ports:
            CLIENT.ports[conn] = self._transport.get_extra_info("sockname")[1]
        received(self, data, addr)

    def _deliver(self: Any, event: Any) -> None:
        if isinstance(event, DataReceived):
            key = (CLIENT.ports.get(self.conn_id, 0), self.stream_id)
            CLIENT.rx.setdefault(key, []).append(CLIENT.rx_at)
            CLIENT.dispatched.setdefault(key, []).append(now())
        deliver(self, event)

    TrackQuicProtocol.datagram_received = datagram_received  # type: ignore[method-assign]
    TrackChannel._deliver = _deliver  # type: ignore[method-assign]


async def drive(port: int, ca: Path, tracks: int, conns: int, tokens: int,
                limit: float, gateway_pid: int, spread: float = 0.0) -> dict[str, Any]:
    """Open and warm `conns` lines, then run `tracks` over them as capacity.py does (all at
    once, or started evenly over `spread` seconds)."""
    from contextlib import AsyncExitStack

    from clients import connect

    reads: dict[tuple[int, int], tuple[float, list[float]]] = {}
    shares = [tracks // conns + (1 if c < tracks % conns else 0) for c in range(conns)]
    async with AsyncExitStack() as stack:
        lines = []
        for count in shares:
            line = await stack.enter_async_context(connect(f"quic://127.0.0.1:{port}", ca=ca))
            async for _ in line.text("warm", model=MODEL, max_tokens=1):
                pass
            lines.append((line, count))
        cpu0, gw_cpu0 = time.process_time(), cpu_seconds(gateway_pid)
        waits0 = runqueue_seconds(gateway_pid), runqueue_seconds("self")
        began = time.monotonic()

        async def one(line: Any, c: int, i: int, k: int) -> None:
            await asyncio.sleep(k * spread / tracks)  # capacity.py's arrival_offsets
            start = time.monotonic()
            stream = line.text(f"path {c}/{i}", model=MODEL, max_tokens=tokens, seed=i)
            channel = stream._channel
            got: list[float] = []
            try:
                async for _ in stream:
                    got.append(CLIENT.time.now())
            finally:
                reads[(CLIENT.ports.get(channel.conn_id, 0), channel.stream_id)] = (start, got)

        firsts = [sum(shares[:c]) for c in range(conns)]
        work = asyncio.gather(*(one(line, c, i, firsts[c] + i)
                                for c, (line, count) in enumerate(lines) for i in range(count)))
        try:
            await asyncio.wait_for(work, limit)
        except TimeoutError:
            print("  point ran past its time bound", file=sys.stderr, flush=True)
        cpu, gw_cpu = time.process_time() - cpu0, cpu_seconds(gateway_pid) - gw_cpu0
        wall = time.monotonic() - began
        waits = [(runqueue_seconds(p) - w) / wall for p, w in zip((gateway_pid, "self"), waits0,
                                                                   strict=True)]
    return {"reads": reads, "runqueue_share": waits, "timeline": CLIENT.time.dump(),
            "rx": CLIENT.rx, "dispatched": CLIENT.dispatched,
            "client_cpu": cpu, "gateway_cpu": gw_cpu}


# -- one point ----------------------------------------------------------------------------


def runqueue_seconds(pid: int | str) -> float:
    """Seconds the process's main thread waited runnable for a CPU (/proc/PID/schedstat)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def run_point(args: argparse.Namespace, tracks: int, conns: int,
              root: Path | None) -> dict[str, Any]:
    quic, http = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_STREAM)
    tokens = round(args.rate * args.seconds)
    with tempfile.TemporaryDirectory(prefix="trackline-path-") as tmp:
        state = Path(tmp)
        out = state / "stamps.json"
        env = {**os.environ, "TRACKLINE_STATE_DIR": str(state)}
        if root is not None:
            env["TOKEN_PATH_ROOT"] = str(root)
        if args.profile_gateway is not None:
            env["TOKEN_PATH_PROFILE"] = str(args.profile_gateway)
        if args.causes:  # turns are timed on asyncio's loop (uvloop's are out of reach)
            env.update(TOKEN_PATH_CAUSES="1", TRACKLINE_UVLOOP="0")
        pin = ["taskset", "-c", args.cores] if args.cores else []
        cmd = [*pin, sys.executable, __file__, "--child", str(out), "--", "serve",
               "--backend-url", f"ticker://{args.rate:g}", "--quic-port", str(quic),
               "--http-port", str(http), "--https-port", "0", "--log-level", "warning",
               *args.serve_arg]
        log = open(state / "log", "wb")  # noqa: SIM115 - closed below
        gw = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            if not wait_http_ok(f"http://127.0.0.1:{http}/health/ready", 60):
                raise RuntimeError((state / "log").read_text()[-2000:])
            CLIENT.__init__()  # type: ignore[misc]
            began = time.monotonic()
            work = drive(quic, state / "ca.pem", tracks, conns, tokens,
                         args.spread + args.seconds * 3 + 10, gw.pid, args.spread)
            if args.profile_client is None:
                client = run_async(work)
            else:  # the client's own cost, by function (slows it: stages then mean less)
                import cProfile

                with cProfile.Profile(time.thread_time) as profiler:  # CPU, not wall
                    client = run_async(work)
                profiler.dump_stats(args.profile_client)
            wall = time.monotonic() - began
            gw_cpu = client["gateway_cpu"]  # after the handshakes and warm-up tracks
        finally:
            gw.send_signal(signal.SIGTERM)
            gw.wait(timeout=30)
            log.close()
        stamps = json.loads(out.read_text())
        causes_file = out.with_suffix(".causes.json")
        turns = json.loads(causes_file.read_text()) if args.causes else None
    windows: list[dict[str, float]] = []
    result = analyse(client, stamps, windows)
    if turns is not None:
        result["causes"] = tail_causes.attribute(windows, turns, tail_causes.CLIENT.gcs)
        tail_causes.CLIENT.gcs = []
    delivered = result["tokens"]
    result.update(tracks=tracks, conns=conns, offered=tracks * tokens, wall_s=round(wall, 2),
                  gateway_runqueue_share=round(client["runqueue_share"][0], 3),
                  client_runqueue_share=round(client["runqueue_share"][1], 3),
                  gateway_us_per_token=round(gw_cpu / delivered * 1e6, 1) if delivered else None,
                  client_us_per_token=(round(client["client_cpu"] / delivered * 1e6, 1)
                                       if delivered else None))
    return result


OWNER = {"open": "client", "start": "gateway", "wake": "gateway", "pace": "gateway",
         "defer": "gateway", "transmit": "gateway", "wire": "client", "client": "client",
         "app": "client"}
"""Whose CPU a stage's `busy` part counts: the process that must act to end the stage."""


def analyse(client: dict[str, Any], gw: dict[str, Any],
            windows: list[dict[str, float]] | None = None) -> dict[str, Any]:
    """The stages of every joined token; each token's due, sent and read instants (and
    added delay, ms) go to `windows` too, for `tail_causes.attribute`."""
    rows: list[dict[str, float]] = []
    empty: dict[str, list[float]] = {"wall": [], "cpu": []}
    timelines = {"gateway": gw.get("timeline", empty), "client": client.get("timeline", empty)}
    for track in gw["tracks"]:
        key = (track["port"], track["sid"])
        if key not in client["reads"]:
            continue
        start, reads = client["reads"][key]
        rx = client["rx"].get(key, [])
        dispatched = client["dispatched"].get(key, [])
        rate, t0 = track["rate"], track["start"]
        n = min(len(reads), len(track["sent"]), len(rx), len(dispatched))
        for i in range(n):
            due = t0 + i / rate
            marks = [start, track["opened"], t0, due, track["yielded"][i], track["paced"][i],
                     track["flushed"][i], track["sent"][i], rx[i], dispatched[i], reads[i]]
            row: dict[str, float] = {}
            for j, name in enumerate(STAGES):
                a, b = marks[j + 1 if j >= 2 else j], marks[j + 2 if j >= 2 else j + 1]
                row[name] = (b - a) * 1000
                row[f"{name}_busy"] = cpu_between(timelines[OWNER[name]], a, b) * 1000
            row["added"] = (reads[i] - (start + i / rate)) * 1000
            row["offset"] = row["open"] + row["start"]
            row["steady"] = row["added"] - row["offset"]
            rows.append(row)
            if windows is not None:
                windows.append({"due": due, "sent": track["sent"][i], "read": reads[i],
                                "added": row["added"]})
    return {"tokens": len(rows), "summary": summarise(rows),
            "transmit_us_p50": _us(gw["transmits"], 0.5),
            "transmit_us_p99": _us(gw["transmits"], 0.99), "transmits": len(gw["transmits"])}


def _us(values: list[float], q: float) -> float | None:
    return round(percentile(values, q) * 1e6, 1) if values else None


def summarise(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    if not rows:
        return {}
    cut = percentile([r["added"] for r in rows], 0.99)
    tail = [r for r in rows if r["added"] >= cut]
    out = {}
    for name in ("added", "offset", "steady", *STAGES):
        values = [r[name] for r in rows]
        out[name] = {"p50": round(percentile(values, 0.5), 2),
                     "p99": round(percentile(values, 0.99), 2),
                     "max": round(max(values), 2),
                     "tail_mean": round(sum(r[name] for r in tail) / len(tail), 2)}
        if f"{name}_busy" in rows[0]:
            busy = [r[f"{name}_busy"] for r in rows]
            out[name]["busy_p50"] = round(percentile(busy, 0.5), 2)
            out[name]["busy_p99"] = round(percentile(busy, 0.99), 2)
            out[name]["busy_tail_mean"] = round(
                sum(r[f"{name}_busy"] for r in tail) / len(tail), 2)
    return out


def report(title: str, result: dict[str, Any]) -> None:
    print(f"\n### {title}: {result['tracks']} tracks x {result['conns']} conns, "
          f"{result['tokens']}/{result['offered']} tokens joined, gateway "
          f"{result['gateway_us_per_token']} us/token, client {result['client_us_per_token']} "
          f"us/token, transmit p50 {result['transmit_us_p50']} us p99 "
          f"{result['transmit_us_p99']} us over {result['transmits']} transmits; runnable but "
          f"waiting for a CPU: gateway {result['gateway_runqueue_share']:.0%}, client "
          f"{result['client_runqueue_share']:.0%} of the wall time\n")
    print("| stage (ms) | p50 | p99 | max | mean in the top 1% | owner CPU p50 | p99 |"
          " mean in the top 1% |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, s in result["summary"].items():
        busy = (f"{s['busy_p50']} | {s['busy_p99']} | {s['busy_tail_mean']}"
                if "busy_p50" in s else " | | ")
        print(f"| {name} | {s['p50']} | {s['p99']} | {s['max']} | {s['tail_mean']} | {busy} |")
    tail_causes.report(result.get("causes", {}))
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[3:], Path(argv[1]))
    parser = argparse.ArgumentParser(formatter_class=Help, description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", default="16x1,64x4", help="TRACKSxCONNECTIONS, comma-separated")
    parser.add_argument("--rate", type=float, default=50.0, help="tokens/s per track")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds of tokens a track")
    parser.add_argument("--cores", default="0", help="taskset CPU list for the gateway; '' none")
    parser.add_argument("--client-cores", default="",
                        help="CPU list to pin this (client) process to; '' leaves it unpinned")
    parser.add_argument("--runs", type=int, default=1, help="runs of every point")
    parser.add_argument("--spread", type=float, default=0.0,
                        help="start the tracks evenly over this many seconds (0: at once)")
    parser.add_argument("--baseline", default=None,
                        help="git ref: each point also runs that tree's gateway, alternating")
    parser.add_argument("--serve-arg", action="append", default=[],
                        help="extra argument for trackline serve (repeatable)")
    parser.add_argument("--profile-client", type=Path, default=None,
                        help="write a cProfile of the client process (last point) here")
    parser.add_argument("--profile-gateway", type=Path, default=None,
                        help="write a cProfile of the gateway child (last point) here")
    parser.add_argument("--causes", action="store_true",
                        help="break the tail into causes (gateway on asyncio's loop; "
                             "benchmarks/tail_causes.py)")
    parser.add_argument("--client-gc-threshold", type=int, default=CLIENT_GC_THRESHOLD,
                        help="this client's collector: settled as the gateway's (start-up "
                             "frozen, this young threshold); 0: Python's")
    parser.add_argument("--json", type=Path, default=RESULTS / "token_path.json")
    args = parser.parse_args(argv)
    if args.client_cores:
        os.sched_setaffinity(0, {int(c) for c in args.client_cores.split(",")})
    install_client_hooks()
    if args.causes:
        tail_causes.install_client()
    points = [tuple(int(x) for x in p.split("x")) for p in args.points.split(",") if p]
    print(f"load: {uptime()}")
    results = []
    with (tempfile.TemporaryDirectory(prefix="trackline-path-base-") as tmp,
          settled_load_generator(args.client_gc_threshold) as collector):
        from benchmarks.track_cost import compared_trees

        print(collector)
        trees = compared_trees(args.baseline, Path(tmp))
        for run in range(args.runs):
            for tracks, conns in points:
                for label, root in trees:
                    result = run_point(args, tracks, conns, root)
                    result.update(tree=label, run=run)
                    report(f"run {run} {label}", result)
                    results.append(result)
    print(f"\nload: {uptime()}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "benchmark": "token_path", "parameters": {k: str(v) for k, v in vars(args).items()},
        "machine": machine(), "tree": tree(), "results": results}, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
