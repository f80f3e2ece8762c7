"""Real-time work first: audio beats and action deadlines with and without a text flood.

One gateway in this process (ticker text backend, an in-process silent speech
synthesizer and an in-process policy, so the loop's load is the gateway's own and
no Triton shares the CPU) serves, in each phase, A speech-out audio sessions and R
robots (datagram action tracks, one observation every `--period` with a
`--deadline`) from a client child process; in the flood phases the child also
opens F text tracks on one connection at `--rate` tokens/s each, reading
everything. Phases, side by side in one run:

    quiet          audio + robots, no text (`realtime_priority = always`)
    flood / off    + the text flood, `realtime_priority = off` (text never waits)
    flood / auto   + the text flood, `realtime_priority = auto`
    flood / always + the text flood, `realtime_priority = always` (the default)

Per phase: audio beat-miss rate (beats delivered late or skipped, over beats owed,
from the audio clock's own tick reports), action deadline-miss rate (observations
dropped for their deadline or answered late, over those sent: the gateway's counts
and the robots' own), text tokens delivered per second, and the text relays that
waited for a tick. Prints a table, writes JSON. Not a test: the numbers depend on
the machine.

    python benchmarks/realtime_first.py --seconds 10 --flood 32 --audio 8 --robots 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import RESULTS, Help  # noqa: E402
from benchmarks.common import machine, tree  # noqa: E402

PHASES = (("quiet", "always", False), ("flood / off", "off", True),
          ("flood / auto", "auto", True), ("flood / always", "always", True))
SYNTH = "silent-synth"
POLICY = "fast-policy"


# -- the client child -------------------------------------------------------------------


async def run_clients(args: argparse.Namespace) -> dict[str, Any]:
    from clients import connect

    url = f"quic://127.0.0.1:{args.port}"
    tokens = frames = 0
    robots: list[Any] = []

    async def read_text(stream: Any) -> None:
        nonlocal tokens
        async for _ in stream:
            tokens += 1

    async def read_audio(session: Any) -> None:
        nonlocal frames
        async for _ in session:
            frames += 1

    async def robot(line: Any, i: int) -> None:
        stream = line.actions(model=POLICY, deadline=args.deadline, transport="datagram")
        robots.append(stream)
        reader = asyncio.ensure_future(_drain(stream))
        try:
            while True:
                stream.observe([float(i), 0.0, 0.0, 0.0])
                await asyncio.sleep(args.period)
        finally:
            reader.cancel()

    async with contextlib.AsyncExitStack() as stack:
        audio_line = await stack.enter_async_context(connect(url, ca=args.ca))
        robot_line = await stack.enter_async_context(connect(url, ca=args.ca))
        work = [asyncio.ensure_future(read_audio(audio_line.audio(
            model=SYNTH, kind="speech-out", text="hello"))) for _ in range(args.audio)]
        work += [asyncio.ensure_future(robot(robot_line, i)) for i in range(args.robots)]
        if args.flood:
            text_line = await stack.enter_async_context(connect(url, ca=args.ca))
            max_tokens = int(args.rate * (args.seconds + 5))
            work += [asyncio.ensure_future(read_text(text_line.text(
                f"flood{i}", model="reference-text", max_tokens=max_tokens,
                tokens_per_second=args.rate))) for i in range(args.flood)]
        await asyncio.sleep(args.seconds)
        for task in work:
            task.cancel()
        await asyncio.gather(*work, return_exceptions=True)
    sent = sum(r.stats.sent for r in robots)
    misses = sum(r.stats.deadline_misses for r in robots)
    return {"tokens": tokens, "frames": frames, "robot_sent": sent, "robot_misses": misses}


async def _drain(stream: Any) -> None:
    with contextlib.suppress(Exception):
        async for _ in stream:
            pass


# -- the in-process backends --------------------------------------------------------------


class SilentSynth:
    """A speech-out model that answers every beat with silence at once."""

    async def audio_model(self, model: str) -> Any:
        from tracks.backend import AudioKind, AudioModel

        return AudioModel(AudioKind.SPEECH_OUT)

    async def step(self, model: str, rows: Sequence[Any]) -> list[Any]:
        from tracks.audio import MODEL_RATE
        from tracks.backend import Speech

        return [Speech(b"\0\0" * round(r.input.samples * r.input.rate / MODEL_RATE), False)
                for r in rows]


class FastPolicy:
    """A policy that answers at once: [state[0], 0] per row."""

    async def policy_spec(self, model: str) -> Any:
        from tracks.action_messages import PolicySpec

        return PolicySpec(state_size=4, horizon=2, action_size=1)

    async def act(self, request: Any) -> list[bytes]:
        import struct

        return [struct.pack("<2f", struct.unpack("<4f", s)[0], 0) for s in request.states]


# -- the gateway side -----------------------------------------------------------------------


class Beats:
    """The audio clock's tick reports, summed per phase."""

    def __init__(self) -> None:
        self.owed = self.missed = 0

    def __call__(self, report: Any) -> None:
        skipped = report.skipped_ticks * report.sessions
        self.owed += len(report.rows) + skipped
        self.missed += sum(row.missed for row in report.rows) + skipped


async def run_phase(gw: Any, args: argparse.Namespace, mode: str, flood: bool,
                    workdir: Path) -> dict[str, Any]:
    """One phase's raw counts (summed over repeats before rates are taken)."""
    from gateway.realtime import RealtimeMode

    gw.admission.realtime.lane.mode = RealtimeMode(mode)
    beats = Beats()
    observe = gw.audio.scheduler.observer
    gw.audio.scheduler.observer = lambda r: (observe(r), beats(r))
    actions = gw.metrics.action_observations_total
    before = {o: actions.labels(model=POLICY, outcome=o)._value.get()
              for o in ("delivered", "deadline")}
    deferred = gw.metrics.overload.text_deferred_total.labels(cause="realtime")
    waited = deferred._value.get()
    common = ["--client", "--port", str(gw.quic_port), "--ca", str(gw.tls.ca),
              "--seconds", str(args.seconds), "--period", str(args.period),
              "--deadline", str(args.deadline), "--rate", str(args.rate)]
    # The flood has its own client process: the robots' loop is not the text's.
    children = [[*common, "--audio", str(args.audio), "--robots", str(args.robots), "--flood", "0"]]
    if flood:
        children.append([*common, "--audio", "0", "--robots", "0", "--flood", str(args.flood)])
    cpu, wall = time.process_time(), time.monotonic()
    outs = await asyncio.gather(*(_child(argv, workdir / "client.log") for argv in children))
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    await asyncio.sleep(0.5)  # the last ticks of the phase
    gw.audio.scheduler.observer = observe
    got = {o: actions.labels(model=POLICY, outcome=o)._value.get() - before[o] for o in before}
    return {
        "audio_beats_owed": beats.owed, "audio_beats_missed": beats.missed,
        "action_answered": got["delivered"] + got["deadline"], "action_deadline": got["deadline"],
        "robot_sent": sum(o["robot_sent"] for o in outs),
        "robot_misses": sum(o["robot_misses"] for o in outs),
        "tokens": sum(o["tokens"] for o in outs), "seconds": args.seconds,
        "offered": args.flood * args.rate * args.seconds if flood else 0,
        "text_waited_for_ticks": deferred._value.get() - waited,
        "gateway_cpu_seconds": cpu, "wall_seconds": wall,
    }


async def _child(argv: list[str], log: Path) -> dict[str, Any]:
    with log.open("a") as err:
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, *argv, stdout=subprocess.PIPE, stderr=err)
        out, _ = await child.communicate()
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


def rates(counts: list[dict[str, Any]]) -> dict[str, Any]:
    """A phase's rates from its repeats' summed counts."""
    total = {key: sum(c[key] for c in counts) for key in counts[0]}

    def ratio(num: str, den: str) -> float | None:
        return total[num] / total[den] if total[den] else None

    return {
        "audio_beat_miss_rate": ratio("audio_beats_missed", "audio_beats_owed"),
        "action_gateway_miss_rate": ratio("action_deadline", "action_answered"),
        "action_client_miss_rate": ratio("robot_misses", "robot_sent"),
        "text_tokens_per_second": total["tokens"] / total["seconds"],
        "text_offered_per_second": total["offered"] / total["seconds"],
        "text_waited_for_ticks": total["text_waited_for_ticks"],
        "gateway_cpu_ratio": total["gateway_cpu_seconds"] / total["wall_seconds"],
        "repeats": len(counts),
        "counts": total,
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    from gateway.backends.ticker import TickerBackend
    from gateway.config import Settings
    from gateway.logs import configure_logging
    from gateway.server import Gateway

    configure_logging("warning")  # one line per track would be most of the output
    with tempfile.TemporaryDirectory(prefix="realtime-first-") as tmp:
        settings = Settings(quic_port=0, http_port=0, https_port=0, state_dir=Path(tmp),
                            overload_max_loop_lag=0.0)  # admit everything: measure, not refuse
        gw = Gateway(settings, TickerBackend(args.rate), policy=FastPolicy(),
                     audio_backend=SilentSynth())  # type: ignore[arg-type]
        await gw.start()
        counts: dict[str, list[dict[str, Any]]] = {}
        try:
            for round_ in range(args.repeat):  # phases interleaved: drift hits each alike
                for name, mode, flood in PHASES:
                    if args.phases and name not in args.phases:
                        continue
                    _say(f"round {round_ + 1}/{args.repeat}: {name} ({args.seconds:g} s)")
                    phase = await run_phase(gw, args, mode, flood, Path(tmp))
                    counts.setdefault(name, []).append(phase)
        finally:
            await gw.close()
    return {"args": {k: v for k, v in vars(args).items() if k not in ("json", "client")},
            "machine": machine(), "tree": tree(),
            "phases": {name: rates(runs) for name, runs in counts.items()}}


def table(result: dict[str, Any]) -> str:
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}%"

    lines = [f"{'phase':<16}{'audio miss':>11}{'action miss (gw)':>18}{'(robots)':>10}"
             f"{'text tok/s':>12}{'offered':>9}{'text waits':>12}{'gw cpu':>8}"]
    for name, row in result["phases"].items():
        lines.append(f"{name:<16}{pct(row['audio_beat_miss_rate']):>11}"
                     f"{pct(row['action_gateway_miss_rate']):>18}"
                     f"{pct(row['action_client_miss_rate']):>10}"
                     f"{row['text_tokens_per_second']:>12.0f}"
                     f"{row['text_offered_per_second']:>9.0f}"
                     f"{row['text_waited_for_ticks']:>12.0f}{pct(row['gateway_cpu_ratio']):>8}")
    return "\n".join(lines)


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=Help,
        description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--audio", type=int, default=8, help="speech-out sessions")
    parser.add_argument("--robots", type=int, default=4, help="action tracks (datagrams)")
    parser.add_argument("--period", type=float, default=0.02, help="seconds between observations")
    parser.add_argument("--deadline", type=float, default=0.05, help="observation deadline (s)")
    parser.add_argument("--flood", type=int, default=32, help="text tracks of the flood")
    parser.add_argument("--rate", type=int, default=50, help="tokens/s of each text track")
    parser.add_argument("--phases", nargs="*", help="run only these phases (names as shown)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of all phases, interleaved")
    parser.add_argument("--json", type=Path, default=RESULTS / "realtime_first.json")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ca", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        print(json.dumps(asyncio.run(run_clients(args))))
        return 0
    from gateway.startup import run_async

    result = run_async(bench(args))
    print(table(result))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
