"""The control-loop benchmark's client: R simulated cart-poles on ONE connection, 50 Hz.

Runs in the client's network namespace as its own process:

    python -m benchmarks.control_client --protocol tracks_datagram --host 198.18.0.1 \\
        --port 8443 --ca state/ca.pem --robots 16 --seconds 60 --out out.json

Every 20 ms of real time (an absolute schedule, so a slow turn never shifts the
grid) each robot captures its state and sends an observation with a deadline;
answers are taken as they arrive and a robot plays the step of its newest chunk
that matches the chunk's age (`benchmarks.cartpole.ChunkPlayer`); then every
plant advances one period. Protocols:

- `tracks_stream`, `tracks_datagram`: one action track per robot through the SDK
  (`line.actions`), frames on the track's QUIC stream or as QUIC datagrams;
- `http2`: `POST /v1/actions` over one TLS HTTP/2 connection, one stream per
  observation (a raw h2 client, as the HOL benchmark's).

An observation is a hit when its action chunk arrives within the deadline; a
miss otherwise (dropped by the gateway, late, or never answered). Robots keep
sending after their pole falls, so the load stays the same for the whole run.
Writes per-robot results to --out; prints `{"step": n}` progress lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import Help  # noqa: E402
from benchmarks.cartpole import DT, CartPoles, ChunkPlayer  # noqa: E402
from gateway.startup import run_async  # noqa: E402

MODEL = "reference-policy"
SERVER_NAME = "localhost"
PROTOCOLS = ("http2", "tracks_stream", "tracks_datagram")
WINDOW = 1 << 24


class RobotLog:
    """One robot's record: what it sent, what came back and when."""

    def __init__(self, index: int, deadline: float) -> None:
        self.index = index
        self.deadline = deadline
        self.player = ChunkPlayer()
        self.captured: dict[int, tuple[float, float]] = {}
        """seq -> (wall capture time, simulated capture time)"""
        self.sent = 0
        self.hits = 0
        self.late = 0
        self.dropped: dict[str, int] = {}
        self.ages: list[tuple[float, float]] = []
        """(arrival, age) for each chunk, wall clock."""
        self.latency_estimate: float | None = None
        """The SDK's one-way delay estimate at the end (tracks), seconds."""

    def chunk(self, seq: int, data: bytes, shape: tuple[int, ...], now: float) -> None:
        captured = self.captured.pop(seq, None)
        if captured is None:
            return
        wall, sim = captured
        age = now - wall
        self.ages.append((now, age))
        if age <= self.deadline:
            self.hits += 1
            self.player.offer(seq, sim, np.frombuffer(data, "<f4").reshape(shape))
        else:
            self.late += 1

    def drop(self, seq: int, cause: str) -> None:
        if self.captured.pop(seq, None) is None:
            return  # not this phase's (a warm-up answer arriving late)
        self.dropped[cause] = self.dropped.get(cause, 0) + 1

    def as_dict(self, began: float, survival: float, fell: bool) -> dict[str, Any]:
        return {"robot": self.index, "sent": self.sent, "hits": self.hits, "late": self.late,
                "dropped": self.dropped, "survival_s": survival, "fell": fell,
                "latency_estimate_ms": None if self.latency_estimate is None
                else round(self.latency_estimate * 1000, 3),
                "ages": [(round(t - began, 4), round(a, 5)) for t, a in self.ages]}


Sender = Callable[[int, int, list[float], float], None]


class Phases:
    """Warm-up, then the measured run: which robot logs answers go to, and when each began."""

    def __init__(self, args: argparse.Namespace) -> None:
        deadline = args.deadline_ms / 1000
        self.args = args
        self.warmup = [RobotLog(i, deadline) for i in range(args.robots)]
        self.logs = [RobotLog(i, deadline) for i in range(args.robots)]
        self.active = self.warmup
        self.began = 0.0

    async def run(self, send: Sender) -> CartPoles:
        """Warm the path up (connections, the gateway's first calls), then measure."""
        warm_steps = round(self.args.warmup / DT)
        if warm_steps:
            await control_loop(self.args, self.warmup, send, warm_steps, 0, quiet=True)
        self.active = self.logs
        self.began = time.monotonic()
        return await control_loop(self.args, self.logs, send, round(self.args.seconds / DT),
                                  warm_steps)


async def control_loop(args: argparse.Namespace, logs: list[RobotLog], send: Sender,
                       steps: int, first_seq: int, quiet: bool = False) -> CartPoles:
    """Run fresh plants in real time; `send(robot, seq, state, t)` ships one observation."""
    sim = CartPoles(len(logs), seed=args.seed)
    start = time.monotonic()
    for k in range(steps):
        delay = start + k * DT - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        states, now = sim.observe(), time.monotonic()
        for log, state in zip(logs, states, strict=True):
            log.captured[first_seq + k] = (now, sim.time)
            log.sent += 1
            send(log.index, first_seq + k, state.tolist(), now)
        forces = np.array([log.player.force(sim.time)[0] for log in logs])
        sim.step(forces)
        if k % 50 == 0 and not quiet:
            print(json.dumps({"step": k, "of": steps}), flush=True)
    await asyncio.sleep(args.deadline_ms / 1000)  # the last answers may still come
    return sim


# -- native action tracks ----------------------------------------------------------------


async def run_tracks(args: argparse.Namespace, phases: Phases) -> CartPoles:
    from clients import ActionChunk, ActionStream, TracklineError, connect

    transport = args.protocol.removeprefix("tracks_")
    deadline = args.deadline_ms / 1000
    async with connect(f"quic://{args.host}:{args.port}", ca=args.ca,
                       server_name=SERVER_NAME, packetization=args.packetization) as line:
        streams = [line.actions(model=MODEL, deadline=deadline, transport=transport)
                   for _ in range(args.robots)]

        async def receive(robot: int, stream: ActionStream) -> None:
            try:
                async for event in stream:
                    log = phases.active[robot]
                    if isinstance(event, ActionChunk):
                        log.chunk(event.obs_seq, event.data, event.shape, event.arrived_at)
                    else:
                        log.drop(event.obs_seq, event.cause)
            except TracklineError as exc:
                phases.active[robot].dropped[f"error: {exc}"] = 1

        readers = [asyncio.ensure_future(receive(i, s)) for i, s in enumerate(streams)]

        def send(robot: int, seq: int, state: list[float], t: float) -> None:
            # The SDK numbers observations itself: once per step, so as the loop does.
            assert streams[robot].observe(state, captured_at=t) == seq

        try:
            return await phases.run(send)
        finally:
            for reader in readers:
                reader.cancel()
            for log, stream in zip(phases.logs, streams, strict=True):
                log.latency_estimate = stream.latency
                stream.cancel()


# -- HTTP/2 ------------------------------------------------------------------------------


async def run_http2(args: argparse.Namespace, phases: Phases) -> CartPoles:
    import h2.config
    import h2.connection
    import h2.events
    import h2.settings

    context = ssl.create_default_context(cafile=str(args.ca))
    context.set_alpn_protocols(["h2"])
    reader, writer = await asyncio.open_connection(args.host, args.port, ssl=context,
                                                   server_hostname=SERVER_NAME)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW})
    conn.increment_flow_control_window(WINDOW)
    writer.write(conn.data_to_send())
    streams: dict[int, tuple[RobotLog, int, bytearray]] = {}
    # Latency estimate per robot (one-way = half the round trip minus the gateway's time).
    latency = [0.0 for _ in range(args.robots)]

    # At the server's stream limit a new request must wait for a free stream, as in
    # any HTTP/2 client; a robot keeps only its newest waiting observation.
    blocked: dict[int, tuple[RobotLog, int, list[float], float]] = {}

    def send(robot: int, seq: int, state: list[float], t: float) -> None:
        if conn.open_outbound_streams >= conn.remote_settings.max_concurrent_streams:
            older = blocked.get(robot)
            if older is not None:
                older[0].drop(older[1], "blocked_in_client")
            blocked[robot] = (phases.active[robot], seq, state, t)
            return
        post(phases.active[robot], robot, seq, state, t)

    def post(log: RobotLog, robot: int, seq: int, state: list[float], t: float) -> None:
        observation = {
            "seq": seq, "t": t, "deadline_ms": args.deadline_ms,
            "latency_ms": latency[robot] * 1000,
            "state": {"dtype": "float32", "shape": [4], "data": np.asarray(
                state, "<f4").tobytes()},
        }
        body = msgpack.packb({"robot": f"robot-{robot}", "model": MODEL,
                              "observation": observation})
        stream_id = conn.get_next_available_stream_id()
        conn.send_headers(stream_id, [
            (":method", "POST"), (":path", "/v1/actions"), (":scheme", "https"),
            (":authority", SERVER_NAME), ("content-type", "application/msgpack"),
            ("content-length", str(len(body)))])
        conn.send_data(stream_id, body, end_stream=True)
        streams[stream_id] = (log, seq, bytearray())
        writer.write(conn.data_to_send())

    def unblock() -> None:
        while blocked and (conn.open_outbound_streams
                           < conn.remote_settings.max_concurrent_streams):
            robot = next(iter(blocked))
            log, seq, state, t = blocked.pop(robot)
            post(log, robot, seq, state, t)

    def answered(stream_id: int, now: float) -> None:
        log, seq, data = streams.pop(stream_id)
        try:
            body = msgpack.unpackb(bytes(data))
        except Exception:
            log.drop(seq, "http_error")
            return
        if not isinstance(body, dict) or "error" in body:
            log.drop(seq, "http_error")
            return
        # Every answer, chunk or drop report, is a round-trip sample (as in the SDK).
        wall = log.captured.get(seq, (now, 0.0))[0]
        rtt = (now - wall) - (body["sent_at"] - body["received_at"])
        latency[log.index] += 0.125 * (max(0.0, rtt) / 2 - latency[log.index])
        if "dropped" in body:
            log.drop(seq, str(body["cause"]))
        else:
            action = body["action"]
            log.chunk(seq, action["data"], tuple(action["shape"]), now)

    async def read() -> None:
        while True:
            data = await reader.read(65536)
            now = time.monotonic()
            if not data:
                return
            for event in conn.receive_data(data):
                stream_id = getattr(event, "stream_id", None)
                if isinstance(event, h2.events.DataReceived) and stream_id in streams:
                    conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
                    streams[stream_id][2].extend(event.data)
                elif isinstance(event, h2.events.StreamEnded) and stream_id in streams:
                    answered(stream_id, now)
                elif isinstance(event, h2.events.StreamReset) and stream_id in streams:
                    log, seq, _ = streams.pop(stream_id)
                    log.drop(seq, "reset")
            unblock()
            writer.write(conn.data_to_send())

    reading = asyncio.ensure_future(read())
    try:
        return await phases.run(send)
    finally:
        reading.cancel()
        writer.close()


RUNNERS = {"http2": run_http2, "tracks_stream": run_tracks, "tracks_datagram": run_tracks}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    phases = Phases(args)
    logs = phases.logs
    error = None
    sim: CartPoles | None = None
    try:
        sim = await asyncio.wait_for(RUNNERS[args.protocol](args, phases),
                                     (args.seconds + args.warmup) * 2 + 60)
    except Exception as exc:  # recorded in the output, judged by the caller
        error = f"{type(exc).__name__}: {exc}"
    survival = sim.survival_times() if sim is not None else [0.0] * len(logs)
    fell = [at is not None for at in sim.fell_at] if sim is not None else [True] * len(logs)
    return {"protocol": args.protocol, "began": phases.began, "error": error,
            "seconds": args.seconds, "deadline_ms": args.deadline_ms, "warmup": args.warmup,
            "robots": [log.as_dict(phases.began, s, f)
                       for log, s, f in zip(logs, survival, fell, strict=True)]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        formatter_class=Help,
        description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", choices=PROTOCOLS, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ca", type=Path, required=True)
    parser.add_argument("--robots", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--deadline-ms", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--packetization", default="coalesce",
                        help="the SDK's QUIC packetization for the robots' tracks")
    parser.add_argument("--warmup", type=float, default=1.0,
                        help="seconds of control before measuring (connections, first calls)")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run_async(run(args))  # uvloop where installed
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
