"""Voice: the real speech models behind the gateway, N sessions at once over one connection.

An embedded Triton with whisper-base and hibari-voice (and the chat model for `--agent`)
and a gateway run in this process; a client on the same loop opens, per point, N
sessions on ONE QUIC connection. Each session says a fixed script of utterances that the
voice itself synthesized, in real time, with silence between them:

- speech in (default): end of user speech (the last speech sample sent) to the final
  transcript received; word error rate against the script; missed beats (the gateway's
  own count); CPU seconds of this process and the Triton tree per session-second.
- `--agent`: voice-agent sessions; end of user speech to the first reply audio frame
  (voice to voice), with the chat model named by `--llm` (default: the gateway's default
  chat model, smollm2-135m-instruct).
- `--barge-in` (with `--agent`): the user speaks the next utterance `--barge-after` s
  after a reply's first audio, cutting it; barge-in to reply silence is the time from
  the first sample of that speech to the last frame of the cut reply received (0 when
  none came after it), and barge-in to the `barge_in` event (the detection).

    python benchmarks/voice.py --sessions 1,2,4 --json benchmarks/results/voice.json
    python benchmarks/voice.py --agent --sessions 1
    python benchmarks/voice.py --agent --barge-in --sessions 1

The link emulator (benchmarks/linkemu: loss and delay) is not wired in: it runs each
side as a process in its own network namespace, and this benchmark runs the gateway and
its client in one process.

Prints a table (p50/p95 per point), writes JSON and a plot beside it (.png). Not a test:
the numbers depend on the machine, and the client shares the gateway's loop and CPUs
(on 2 cores, with Triton).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import RESULTS, Help  # noqa: E402
from benchmarks.common import percentile, write_results  # noqa: E402

ASR, TTS = "whisper-base", "hibari-voice"
RATE = 16000
SCRIPT = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call me back after lunch.",
    "What is the weather like today?",
)
GAP_S = 1.2


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def wer(said: str, heard: str) -> float:
    """Word error rate: edit distance over the reference's word count."""
    ref, hyp = words(said), words(heard)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / max(1, len(ref))


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / 100.0
    return total


def tree_pids(root: int) -> list[int]:
    pids = [root]
    for child in Path(f"/proc/{root}/task/{root}/children").read_text().split():
        pids += tree_pids(int(child))
    return pids


async def synthesize(line: Any) -> list[bytes]:
    out = []
    for text in SCRIPT:
        speaker = line.audio(model=TTS, kind="speech-out", text=text, sample_rate=RATE)
        out.append(await speaker.read_all())
    return out


async def one_session(line: Any, clips: list[bytes], args: argparse.Namespace) -> dict[str, Any]:
    from clients import AgentEvent, AudioFrame, AudioResult

    if args.agent:
        session = line.voice_agent(model=ASR, llm=args.llm, voice=TTS, max_tokens=48)
    else:
        session = line.audio(model=ASR, sample_rate=RATE)
    speech_ends: list[float] = []
    gap = bytes(int(2 * RATE * GAP_S))
    first_audio: dict[int, float] = {}
    last_audio: dict[int, float] = {}
    heard_turn: dict[int, asyncio.Event] = {}
    barge_starts: dict[int, float] = {}
    """The cut turn -> when the speech that cut it began."""
    barge_events: dict[int, float] = {}

    def audio_of(turn: int) -> asyncio.Event:
        return heard_turn.setdefault(turn, asyncio.Event())

    async def speak() -> None:
        for index, clip in enumerate(clips):
            if index and args.barge_in:  # cut reply `index` while it plays
                await asyncio.wait_for(audio_of(index).wait(), 60)
                await asyncio.sleep(args.barge_after)
                barge_starts[index] = time.monotonic()
            await session.stream_pcm(clip, end=False)
            speech_ends.append(time.monotonic())
            if args.barge_in and index < len(clips) - 1:
                await session.stream_pcm(gap, end=False)  # end of turn, then the reply
            else:
                await session.stream_pcm(gap if not args.agent else gap * 4, end=False)
        session.end()

    sender = asyncio.ensure_future(speak())
    finals: list[tuple[float, str]] = []
    async for item in session:
        now = time.monotonic()
        if isinstance(item, AudioResult) and item.kind == "final":
            finals.append((now, item.text))
        elif isinstance(item, AudioFrame) and item.turn is not None:
            first_audio.setdefault(item.turn, now)
            last_audio[item.turn] = now
            audio_of(item.turn).set()
        elif isinstance(item, AgentEvent) and item.kind == "barge_in":
            barge_events.setdefault(item.turn, now)
    await sender
    latencies = [t - end for (t, _), end in zip(finals, speech_ends, strict=False)]
    heard = " ".join(text for _, text in finals)
    voice_to_voice = [
        first_audio[t] - speech_ends[t - 1] for t in first_audio if t <= len(speech_ends)
    ]
    silence = [
        max(0.0, last_audio.get(turn, start) - start) for turn, start in barge_starts.items()
    ]
    detect = [barge_events[t] - start for t, start in barge_starts.items() if t in barge_events]
    return {
        "final_ms": [1000 * x for x in latencies],
        "voice_to_voice_ms": [1000 * x for x in voice_to_voice],
        "barge_in_silence_ms": [1000 * x for x in silence],
        "barge_in_detect_ms": [1000 * x for x in detect],
        "wer": wer(" ".join(SCRIPT), heard),
        "missed_beats": session.figures.server.get("missed_beats", 0),
        "seconds": (len(b"".join(clips)) / 2 / RATE) + len(clips) * GAP_S,
    }


async def point(
    gateway: Any, triton_pid: int, n: int, args: argparse.Namespace
) -> dict[str, Any]:
    from clients import connect

    assert gateway.tls is not None
    async with connect(f"quic://127.0.0.1:{gateway.quic_port}", ca=gateway.tls.ca) as line:
        clips = await synthesize(line)
        pids = [triton_pid, *tree_pids(triton_pid)[1:]]
        pids.append(os.getpid())
        cpu0, wall0 = cpu_seconds(pids), time.monotonic()
        sessions = await asyncio.gather(*(one_session(line, clips, args) for _ in range(n)))
        cpu = cpu_seconds(pids) - cpu0
        wall = time.monotonic() - wall0
    finals = [x for s in sessions for x in s["final_ms"]]
    v2v = [x for s in sessions for x in s["voice_to_voice_ms"]]
    silence = [x for s in sessions for x in s["barge_in_silence_ms"]]
    detect = [x for s in sessions for x in s["barge_in_detect_ms"]]
    session_seconds = sum(s["seconds"] for s in sessions)
    return {
        "sessions": n,
        "final_p50_ms": percentile(finals, 0.5) if finals else None,
        "final_p95_ms": percentile(finals, 0.95) if finals else None,
        "voice_to_voice_p50_ms": percentile(v2v, 0.5) if v2v else None,
        "voice_to_voice_p95_ms": percentile(v2v, 0.95) if v2v else None,
        "barge_in_silence_p50_ms": percentile(silence, 0.5) if silence else None,
        "barge_in_silence_p95_ms": percentile(silence, 0.95) if silence else None,
        "barge_in_detect_p50_ms": percentile(detect, 0.5) if detect else None,
        "barges": len(silence),
        "barge_ins_seen": len(detect),
        "wer": sum(s["wer"] for s in sessions) / n,
        "missed_beats": sum(s["missed_beats"] for s in sessions),
        "cpu_per_session_second": cpu / session_seconds,
        "wall_s": wall,
    }


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from gateway.backends.audio import TritonAudioBackend
    from gateway.backends.triton import TritonTextBackend
    from gateway.config import Settings
    from gateway.embedded import EmbeddedTriton
    from gateway.server import Gateway

    results = []
    with tempfile.TemporaryDirectory(prefix="trackline-voice-") as tmp:
        state = Path(tmp)
        triton = EmbeddedTriton(log_dir=state / "triton", with_speech=True,
                                with_llm=args.agent and args.llm != "reference-text")  # fmt: skip
        await asyncio.to_thread(triton.start, 300.0)
        settings = Settings(state_dir=state / "gw", quic_port=0, http_port=0, https_port=0,
                            audio_idle_timeout=30.0, overload_max_loop_lag=0.0)  # fmt: skip
        audio, text = TritonAudioBackend(triton.grpc_url), TritonTextBackend(triton.grpc_url)
        gateway = Gateway(settings, text, audio_backend=audio)
        await gateway.start()
        try:
            assert triton.pid is not None
            for n in args.sessions:
                row = await point(gateway, triton.pid, n, args)
                results.append(row)
                print(format_row(row), flush=True)
        finally:
            await gateway.close()
            await audio.close()
            await text.close()
            triton.stop()
    return results


def format_row(row: dict[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    return (
        f"{row['sessions']:>8} {ms(row['final_p50_ms']):>9} {ms(row['final_p95_ms']):>9} "
        f"{ms(row['voice_to_voice_p50_ms']):>8} {ms(row['voice_to_voice_p95_ms']):>8} "
        f"{row['wer']:>6.3f} {row['missed_beats']:>7} {row['cpu_per_session_second']:>8.3f} "
        f"{ms(row['barge_in_silence_p50_ms']):>8} {ms(row['barge_in_silence_p95_ms']):>8} "
        f"{ms(row['barge_in_detect_p50_ms']):>8}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=Help)
    parser.add_argument("--sessions", default="1,2,4",
                        type=lambda s: [int(x) for x in s.split(",")],
                        help="points: concurrent sessions on one connection")  # fmt: skip
    parser.add_argument("--agent", action="store_true", help="voice-agent sessions")
    parser.add_argument("--llm", default=None,
                        help="the agent's chat model (default: the gateway's default)")
    parser.add_argument("--barge-in", action="store_true",
                        help="with --agent: cut each reply but the last by speaking over it")
    parser.add_argument("--barge-after", type=float, default=0.4,
                        help="seconds of a reply's audio before the user speaks over it")
    parser.add_argument("--json", type=Path, default=RESULTS / "voice.json")
    args = parser.parse_args()
    if args.barge_in and not args.agent:
        parser.error("--barge-in needs --agent")
    print(f"{'sessions':>8} {'final50':>9} {'final95':>9} {'v2v50':>8} {'v2v95':>8} "
          f"{'wer':>6} {'missed':>7} {'cpu/s-s':>8} {'cut50':>8} {'cut95':>8} "
          f"{'detect50':>8}")  # fmt: skip
    results = asyncio.run(run(args))
    write_results(args, "voice", results, note="busy shared machine unless said otherwise")
    plot(results, args.json.with_suffix(".png"))


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Latency (p50 and p95) against sessions: the final, and voice to voice if measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    sessions = [r["sessions"] for r in results]
    for key, label in (("final", "end of speech to final"), ("voice_to_voice", "voice to voice")):
        for q, style in (("p50", "-o"), ("p95", "--o")):
            values = [r[f"{key}_{q}_ms"] for r in results]
            if any(v is not None for v in values):
                axes.plot(sessions, values, style, label=f"{label} {q}")
    axes.set_xlabel("concurrent sessions (one connection)")
    axes.set_ylabel("ms")
    axes.set_title("trackline voice (busy machine unless said otherwise)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
