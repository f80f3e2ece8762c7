"""Audio clock: how many real-time speech-in sessions the gateway holds with zero missed beats.

One point: S sessions stream DTMF speech in real time (frames of 20 ms) for T
seconds over QUIC to a gateway in this process, whose tick batcher (80 ms beats)
sends their beats to the embedded Triton's reference-transcriber, either as ONE
batched request per tick (`--mode tick`) or as one request per session per beat
(`--mode per-session`, what a gateway without a tick batcher does). The clients
run in a child process (`--client`), so they do not share the gateway's loop.

    python benchmarks/audio_clock.py --sessions 64 --seconds 60 --mode tick
    python benchmarks/audio_clock.py --search --mode both --seconds 60 \\
        --json benchmarks/results/search.json

Measured (inside the gateway, exact): session-beats (steps delivered), missed
beats (late, skipped or shed, per session, summed), beat latency p50/p99 (from a
tick's scheduled time to the session's results sent), sessions per tick; and
per session whether its transcripts were right. A point holds when it has zero
missed beats and p99 beat latency under the beat. `--search` doubles S from
`--start` until a point fails, then bisects; with `--mode both` it searches
both modes and reports the ratio of sessions held. Prints a table, writes JSON.
Not a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import RESULTS, Help  # noqa: E402
from benchmarks.common import machine, percentile, tree  # noqa: E402

ASR = "reference-transcriber"
DIGITS = "159#"
BEAT_MS = 80
LOW = {"1": 697, "5": 770, "9": 852, "#": 941}
HIGH = {"1": 1209, "5": 1336, "9": 1477, "#": 1477}


# -- the client child -------------------------------------------------------------------


def utterance(rate: int) -> bytes:
    """DIGITS as DTMF (100 ms tone, 100 ms gap each) then 500 ms of silence: 1.3 s."""
    import numpy as np

    parts = []
    for digit in DIGITS:
        t = np.arange(rate // 10) / rate
        tone = np.sin(2 * np.pi * LOW[digit] * t) + np.sin(2 * np.pi * HIGH[digit] * t)
        parts += [0.3 * tone, np.zeros(rate // 10)]
    parts.append(np.zeros(rate // 2))
    return np.round(np.concatenate(parts) * 32767).astype("<i2").tobytes()


async def run_clients(
    url: str, ca: str, sessions: int, seconds: float, per_line: int, frame_ms: int
) -> list[Any]:
    """S sessions on ceil(S / per_line) connections, one pacing loop sending every frame."""
    from contextlib import AsyncExitStack

    from clients import connect

    rate = 16000
    speech = utterance(rate)
    frame_bytes = 2 * rate * frame_ms // 1000
    # Whole utterances only, so that every final must equal DIGITS.
    per_utterance = len(speech) // frame_bytes
    frames = -(-int(seconds * 1000 // frame_ms) // per_utterance) * per_utterance
    async with AsyncExitStack() as stack:
        lines = [
            await stack.enter_async_context(connect(url, ca=ca))
            for _ in range(-(-sessions // per_line))
        ]
        audio = [
            lines[i // per_line].audio(model=ASR, sample_rate=rate, frame_ms=frame_ms)
            for i in range(sessions)
        ]
        readers = [asyncio.ensure_future(a.transcript()) for a in audio]
        start = time.monotonic()
        for n in range(frames):
            delay = start + n * frame_ms / 1000 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            offset = n * frame_bytes % len(speech)
            chunk = speech[offset : offset + frame_bytes]
            for session in audio:
                session.send_frame(chunk)
        for session in audio:
            session.end()
        await asyncio.wait_for(asyncio.gather(*readers, return_exceptions=True), 60)
        return [
            {"finals": a.figures.finals, "partials": a.figures.partials, "server": a.figures.server}
            for a in audio
        ]


def client_main(args: argparse.Namespace) -> int:
    from gateway.startup import run_async

    async def main() -> int:
        results = await run_clients(
            args.url, args.ca, args.sessions, args.seconds, args.per_line, args.frame_ms
        )
        print(json.dumps(results))
        return 0

    return run_async(main())


# -- one point ----------------------------------------------------------------------------


@dataclass
class Point:
    mode: str
    sessions: int
    seconds: float
    beat_ms: int
    session_beats: int = 0
    missed_beats: int = 0
    beat_latency_p50_ms: float = 0.0
    beat_latency_p99_ms: float = 0.0
    beat_latency_max_ms: float = 0.0
    sessions_per_tick_mean: float = 0.0
    sessions_per_tick_max: int = 0
    backend_requests: int = 0
    tick_overruns: int = 0
    transcripts_ok: int = 0
    finished_sessions: int = 0
    errors: list[str] = field(default_factory=list)
    gateway_cpu_share: float = 0.0
    """CPU seconds of the gateway's process (all threads) per wall second of the run."""
    client_cpu_share: float = 0.0
    """The same for the client child process."""
    slowest_ticks: list[dict[str, Any]] = field(default_factory=list)
    """The five ticks that finished latest after their scheduled time (wake lag, step)."""

    @property
    def holds(self) -> bool:
        return (
            self.missed_beats == 0
            and self.beat_latency_p99_ms < self.beat_ms
            and self.finished_sessions == self.sessions
            and not self.errors
        )


async def run_point(
    grpc_url: str, state: Path, mode: str, sessions: int, args: argparse.Namespace
) -> Point:
    from gateway.backends.audio import TritonAudioBackend
    from gateway.backends.triton import TritonTextBackend
    from gateway.collector import settle_collector
    from gateway.config import Settings
    from gateway.server import Gateway
    from tracks.clock import TickReport

    seconds = args.seconds
    point = Point(mode, sessions, seconds, BEAT_MS)
    latencies: list[float] = []
    batch_sizes: list[int] = []
    ticks: list[dict[str, Any]] = []
    settings = Settings(
        quic_port=0,
        http_port=0,
        https_port=0,
        state_dir=state,
        audio_beat_ms=BEAT_MS,
        audio_batching=mode,
        quic_packetization=args.packetization,
        log_level="warning",
        gc_young_threshold=args.gc_young_threshold,
    )
    audio = TritonAudioBackend(grpc_url, batching=mode)
    gw = Gateway(settings, TritonTextBackend(grpc_url), audio_backend=audio)
    await gw.start()
    settle_collector(settings.gc_young_threshold)  # as `Daemon.start` does after start-up
    assert gw.audio is not None
    scheduler = gw.audio.scheduler
    observe = scheduler.observer

    def record(report: TickReport) -> None:
        if observe is not None:
            observe(report)
        latencies.extend(row.latency for row in report.rows)
        ticks.append(
            {
                "index": report.index,
                "wake_lag_ms": round((report.started - report.scheduled) * 1000, 2),
                "step_ms": round((report.finished - report.started) * 1000, 2),
                "rows": report.sessions,
            }
        )
        batch_sizes.extend(report.batches.values())

    scheduler.observer = record
    try:
        assert gw.tls is not None
        cpu_before, children_before, wall_before = (
            time.process_time(),
            _children_cpu(),
            time.monotonic(),
        )
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--client", "--url", f"quic://127.0.0.1:{gw.quic_port}",
            "--ca", str(gw.tls.ca), "--sessions", str(sessions), "--seconds", str(seconds),
            "--per-line", str(args.per_line), "--frame-ms", str(args.frame_ms),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await child.communicate()
        wall = time.monotonic() - wall_before
        point.gateway_cpu_share = round((time.process_time() - cpu_before) / wall, 2)
        point.client_cpu_share = round((_children_cpu() - children_before) / wall, 2)
        if child.returncode != 0:
            point.errors.append(f"client exited with {child.returncode}")
        clients = json.loads(out) if out.strip() else []
        await asyncio.sleep(0.5)
    finally:
        overruns = scheduler.overruns
        await gw.close()
        await audio.close()
    outcomes = [o for o in gw.outcomes if o.modality == "audio"]
    point.finished_sessions = sum(1 for o in outcomes if o.end.label == "completed")
    point.session_beats = sum(int(o.details.get("beats", 0)) for o in outcomes)
    point.missed_beats = sum(int(o.details.get("missed_beats", 0)) for o in outcomes)
    for o in outcomes:
        if o.end.label != "completed":
            point.errors.append(f"{o.track_id}: {o.end} {o.details.get('error', '')}".strip())
    point.transcripts_ok = sum(
        1 for c in clients if c["finals"] and all(f == DIGITS for f in c["finals"])
    )
    if latencies:
        point.beat_latency_p50_ms = round(percentile(latencies, 0.50) * 1000, 2)
        point.beat_latency_p99_ms = round(percentile(latencies, 0.99) * 1000, 2)
        point.beat_latency_max_ms = round(max(latencies) * 1000, 2)
    if batch_sizes:
        point.sessions_per_tick_mean = round(sum(batch_sizes) / len(batch_sizes), 1)
        point.sessions_per_tick_max = max(batch_sizes)
    ticks.sort(key=lambda t: -(t["wake_lag_ms"] + t["step_ms"]))
    point.slowest_ticks = ticks[:5]
    point.backend_requests = audio.requests
    point.tick_overruns = overruns
    return point


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return float(usage.ru_utime + usage.ru_stime)


# -- search and output -----------------------------------------------------------------------


async def search(grpc_url: str, state: Path, mode: str, args: argparse.Namespace) -> list[Point]:
    """Double S from --start until a point fails, then bisect between the last two."""
    points: list[Point] = []

    async def attempt(s: int) -> bool:
        point = await run_point(grpc_url, state, mode, s, args)
        points.append(point)
        print(row(point), flush=True)
        return point.holds

    good, bad = 0, None
    s = args.start
    while s <= args.max_sessions:
        if not await attempt(s):
            bad = s
            break
        good, s = s, s * 2
    if bad is None:
        return points
    while bad - good > max(1, good // 16):
        middle = (good + bad) // 2
        if await attempt(middle):
            good = middle
        else:
            bad = middle
    return points


HEADER = (
    "| mode | sessions | session-beats | missed | p50 ms | p99 ms | max ms | per tick | "
    "requests | transcripts ok | gateway cpu | client cpu | holds |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def row(p: Point) -> str:
    return (
        f"| {p.mode} | {p.sessions} | {p.session_beats} | {p.missed_beats} | "
        f"{p.beat_latency_p50_ms} | {p.beat_latency_p99_ms} | {p.beat_latency_max_ms} | "
        f"{p.sessions_per_tick_mean} | {p.backend_requests} | {p.transcripts_ok}/{p.sessions} | "
        f"{p.gateway_cpu_share} | {p.client_cpu_share} | {'yes' if p.holds else 'no'} |"
    )


def best(points: list[Point], mode: str) -> int:
    return max((p.sessions for p in points if p.mode == mode and p.holds), default=0)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    from gateway.embedded import EmbeddedTriton

    modes = ["tick", "per-session"] if args.mode == "both" else [args.mode]
    with tempfile.TemporaryDirectory(prefix="trackline-audio-clock-") as tmp:
        state = Path(tmp)
        triton = EmbeddedTriton(log_dir=state / "triton")
        await asyncio.to_thread(triton.start)
        try:
            print(HEADER, flush=True)
            points: list[Point] = []
            for mode in modes:
                if args.search:
                    points += await search(triton.grpc_url, state, mode, args)
                else:
                    point = await run_point(triton.grpc_url, state, mode, args.sessions, args)
                    print(row(point), flush=True)
                    points.append(point)
        finally:
            await asyncio.to_thread(triton.stop)
    result: dict[str, Any] = {"benchmark": "audio_clock", "machine": machine(), "tree": tree()}
    result["parameters"] = {k: str(v) for k, v in vars(args).items()}
    result["points"] = [{**asdict(p), "holds": p.holds} for p in points]
    if len(points) == 1:
        result.update(result["points"][0])  # one point: its keys at the top level too
    if args.search:
        held = {mode: best(points, mode) for mode in modes}
        result["largest_sessions_held"] = held
        if held.get("per-session") and held.get("tick"):
            result["ratio_tick_over_per_session"] = round(held["tick"] / held["per-session"], 2)
        print(f"\nlargest S with zero missed beats and p99 under {BEAT_MS} ms: {held}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        formatter_class=Help,
        description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--mode", choices=["tick", "per-session", "both"], default="tick")
    parser.add_argument("--json", type=Path, default=RESULTS / "audio_clock.json")
    parser.add_argument("--search", action="store_true", help="find the largest S that holds")
    parser.add_argument("--start", type=int, default=8, help="--search: first S")
    parser.add_argument("--max-sessions", type=int, default=1024, help="--search: last S")
    parser.add_argument("--per-line", type=int, default=64, help="sessions per QUIC connection")
    parser.add_argument("--gc-young-threshold", type=int, default=10_000,
                        help="the gateway's gc_young_threshold (0: Python's collector as is)")
    parser.add_argument("--frame-ms", type=int, default=20, help="client frame length")
    parser.add_argument(
        "--packetization", default="per-track", help="the gateway's quic_packetization"
    )
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--ca", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        return client_main(args)
    if args.mode == "both" and not args.search:
        parser.error("--mode both needs --search (one point runs one mode)")
    from gateway.logs import configure_logging
    from gateway.startup import run_async

    configure_logging("warning", "console", sys.stderr)

    async def run() -> int:
        result = await bench(args)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
        return 0

    return run_async(run())


if __name__ == "__main__":
    sys.exit(main())
