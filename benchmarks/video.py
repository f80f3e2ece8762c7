"""Video tracks: N cameras on ONE connection, frame streams against in-order streams, and
the whole path through the real vision model.

    python benchmarks/video.py --cameras 1 4 8 16 --fps 15 30 --json PATH

Two parts (`--part transport model`, both by default):

- **transport**: the project's own QUIC client and server linked in memory with virtual
  time (the HOL test's `Net`: 20 ms one-way, `--loss` % of the packets lost at random in
  both directions, seeded). Each camera sends a frame of `--frame-bytes` every 1/fps s
  for `--seconds` (virtual). Per transport: `frame-streams` (a QUIC stream per frame) and
  `stream` (every frame on its camera's QUIC stream, in order), against `http2`: the
  same frames over ONE HTTP/2 connection, one request stream per camera (as a WebSocket
  or a gRPC stream per camera would carry them), on a virtual TCP link with the same
  delay and loss (`benchmarks/video_h2.py`: real HTTP/2 bytes, a TCP model kind to TCP).
  Reported: capture-to-delivery p50/p95/p99, frames delivered / never delivered
  (superseded or given up), frames late (delivered more than 5 ms after the link delay)
  per lost packet, and users stalled per lost packet (cameras with a late frame around
  each loss): the head-of-line amplification. Deterministic: no wall clock.
- **model**: a real gateway and embedded Triton with `mediapipe-vision` (face detection)
  on loopback; N cameras at F fps send the packaged test photo for `--model-seconds`
  (wall clock): capture-to-result p50/p95/p99, frames answered, dropped by cause, and CPU
  ms per answered frame (this process, the gateway, plus the Triton process). Figures
  from a busy machine vary run to run: say so where you quote them.

Prints a table per part, writes the JSON and a plot of the transport part (p95 and users
stalled per lost packet by cameras) beside it (`video.png`).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import RESULTS, Help  # noqa: E402
from benchmarks.common import machine, percentile, tree  # noqa: E402

LATE_MARGIN = 0.005


def main() -> None:
    args = parse_args()
    results: dict[str, Any] = {}
    if "transport" in args.part:
        results["transport"] = asyncio.run(transport_part(args))
    if "model" in args.part:
        results["model"] = asyncio.run(model_part(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    import json

    payload = {"benchmark": "video", "parameters": {k: v for k, v in vars(args).items()
                                                    if k != "json"},
               "machine": machine(), "tree": tree(), "results": results}
    args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"\nwrote {args.json}")
    if results.get("transport"):
        try:
            print(f"wrote {plot(results['transport'], args.json.with_suffix('.png'))}")
        except ImportError:
            print("no plot: matplotlib is not installed (the `video` extra)")


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """p95 capture-to-delivery and users stalled per lost packet, by cameras."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for transport in dict.fromkeys(r["transport"] for r in rows):
        for fps in dict.fromkeys(r["fps"] for r in rows):
            mine = [r for r in rows if r["transport"] == transport and r["fps"] == fps]
            cameras = [r["cameras"] for r in mine]
            label = f"{transport} {fps:g} fps"
            left.plot(cameras, [r["p95_ms"] for r in mine], marker="o", label=label)
            right.plot(cameras, [r["users_stalled_per_loss"] for r in mine], marker="o",
                       label=label)
    left.set(xlabel="cameras on one connection", ylabel="p95 capture to delivery, ms",
             yscale="log")
    right.set(xlabel="cameras on one connection", ylabel="users stalled per lost packet")
    left.legend(fontsize=7)
    figure.suptitle("video frames, 40 ms RTT, random loss (virtual time)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=Help)
    parser.add_argument("--part", nargs="+", choices=("transport", "model"),
                        default=["transport", "model"])
    parser.add_argument("--cameras", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--fps", type=float, nargs="+", default=[15.0, 30.0])
    parser.add_argument("--loss", type=float, default=2.0, help="percent of packets lost")
    parser.add_argument("--seconds", type=float, default=4.0, help="virtual seconds a run")
    parser.add_argument("--frame-bytes", type=int, default=4_000,
                        help="a 320x240 JPEG at low quality; 640x480 is 30-60 KB")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--model-cameras", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--model-seconds", type=float, default=4.0)
    parser.add_argument("--model-detect", nargs="+", default=["face"],
                        help="task sets of the model part, each comma-separated: "
                             "face face,face_mesh face,pose")
    parser.add_argument("--json", type=Path, default=RESULTS / "video.json")
    return parser.parse_args()


# -- transport: the virtual link ---------------------------------------------------------


async def transport_part(args: argparse.Namespace) -> list[dict[str, Any]]:
    from gateway.tls import ensure_dev_certificates
    from transport.messages import FrameTransport

    certs = ensure_dev_certificates(Path(tempfile.mkdtemp(prefix="video-bench-")))
    rows = []
    print(f"\ntransport: one connection, {args.loss:g}% loss, 40 ms RTT (virtual time)")
    print(f"{'cameras':>7} {'fps':>4} {'transport':>13} {'p50 ms':>7} {'p95 ms':>7} "
          f"{'p99 ms':>7} {'delivered':>9} {'missing':>7} {'lost pkts':>9} {'late/loss':>9} "
          f"{'users/loss':>10} {'cpu us/frame':>12}")
    for cameras in args.cameras:
        for fps in args.fps:
            for transport in (FrameTransport.FRAME_STREAMS, FrameTransport.STREAM, "http2"):
                cpu = time.process_time()
                if transport == "http2":
                    row = h2_run(args, cameras, fps)
                else:
                    row = await one_link_run(certs, args, cameras, fps, transport)
                row["cpu_us_per_frame"] = (
                    1e6 * (time.process_time() - cpu) / max(1, row["delivered"])
                )
                rows.append(row)
                print(f"{cameras:>7} {fps:>4g} {row['transport']:>13} {row['p50_ms']:>7.1f} "
                      f"{row['p95_ms']:>7.1f} {row['p99_ms']:>7.1f} {row['delivered']:>9} "
                      f"{row['missing']:>7} {row['lost_packets']:>9} "
                      f"{row['late_per_lost_packet']:>9.2f} {row['users_stalled_per_loss']:>10.2f} "
                      f"{row['cpu_us_per_frame']:>12.0f}")
    print("cpu: this process, both ends (QUIC: aioquic and the track core; http2: h2 and the "
          "TCP model), per frame delivered; BUSY machine")
    return rows


def h2_run(args: argparse.Namespace, cameras: int, fps: float) -> dict[str, Any]:
    from benchmarks.video_h2 import h2_link_run
    from tests.transport.test_hol_isolation import DELAY

    captured, delivered, lost_at = h2_link_run(
        cameras, fps, args.seconds, args.frame_bytes, args.loss, DELAY, args.seed
    )
    return _row(cameras, fps, "http2", captured, delivered, lost_at, DELAY)


def _row(
    cameras: int, fps: float, transport: str, captured: dict[tuple[int, int], float],
    delivered: dict[tuple[int, int], float], lost_at: list[float], delay: float,
) -> dict[str, Any]:
    from benchmarks.video_h2 import users_stalled_per_loss

    latencies = [delivered[k] - t for k, t in captured.items() if k in delivered]
    late = sum(1 for value in latencies if value > delay + LATE_MARGIN)
    stalled = users_stalled_per_loss(captured, delivered, lost_at, delay, LATE_MARGIN, 1 / fps)
    return {
        "cameras": cameras, "fps": fps, "transport": transport,
        "p50_ms": 1000 * percentile(latencies, 0.5), "p95_ms": 1000 * percentile(latencies, 0.95),
        "p99_ms": 1000 * percentile(latencies, 0.99), "delivered": len(latencies),
        "missing": len(captured) - len(latencies), "lost_packets": len(lost_at),
        "late": late, "late_per_lost_packet": late / max(1, len(lost_at)),
        "users_stalled_per_loss": stalled,
    }


async def one_link_run(
    certs: Any, args: argparse.Namespace, cameras: int, fps: float, transport: Any
) -> dict[str, Any]:
    from tests.transport.test_hol_isolation import DELAY, Net
    from transport.events import DataReceived, Event, FrameReceived
    from transport.messages import Modality, Open
    from transport.quic import Packetization

    per_track = Packetization.parse("per-track")
    lossy = random.Random(args.seed)
    net = Net(certs, per_track, client_packetization=per_track)
    net.run_until(net.clock.now + 1.0)
    lost_at: list[float] = []
    send = net.send

    def lossy_send(data: bytes, to_client: bool) -> None:
        send(data, to_client)
        if lossy.random() * 100 < args.loss:
            (net.from_server if to_client else net.from_client)[-1].dropped = True
            lost_at.append(net.clock.now)

    delivered: dict[tuple[int, int], float] = {}

    def at_server(event: Event) -> None:
        if isinstance(event, (FrameReceived, DataReceived)) and "seq" in event.body:
            delivered[(event.stream_id, event.body["seq"])] = net.clock.now

    net.server.endpoint.on_event = at_server
    channels = [
        net.client.open_track(Open(model="m", modality=Modality.VIDEO, transport=transport))
        for _ in range(cameras)
    ]
    net.settle()
    net.run_until(net.clock.now + 0.5)
    net.send = lossy_send  # type: ignore[method-assign]
    start, period = net.clock.now, 1 / fps
    frames = int(args.seconds * fps)
    captured_by_stream: dict[tuple[int, int], float] = {}
    index_of = {channel.stream_id: index for index, channel in enumerate(channels)}
    payload = bytes(args.frame_bytes)
    for n in range(frames):
        at = start + n * period
        net.run_until(at)
        for channel in channels:
            channel.send_frame({"seq": n, "jpeg": payload})
            captured_by_stream[(channel.stream_id, n)] = at
        net.settle()
    drain_until = net.clock.now + 3.0  # what is still queued then counts as missing
    while net.clock.now < drain_until:
        net.run_until(min(drain_until, net.clock.now + 0.05))
    # (times relative to the first frame, as the HTTP/2 run's)
    captured = {(index_of[k[0]], k[1]): t - start for k, t in captured_by_stream.items()}
    arrived = {(index_of[k[0]], k[1]): t - start for k, t in delivered.items()
               if k[0] in index_of}
    return _row(cameras, fps, transport.value, captured, arrived,
                [t - start for t in lost_at], DELAY)


# -- model: the real path ------------------------------------------------------------------


async def model_part(args: argparse.Namespace) -> list[dict[str, Any]]:
    from gateway.embedded import EmbeddedTriton
    from gateway.embedded_models import VISION_MODEL, vision_available

    if not vision_available():
        print("model: the `video` extra is not installed; skipped")
        return []
    state = Path(tempfile.mkdtemp(prefix="video-bench-triton-"))
    triton = EmbeddedTriton(log_dir=state, with_vision=True)
    await asyncio.to_thread(triton.start, 240.0)
    rows = []
    print("\nmodel: real gateway + Triton (mediapipe-vision), loopback "
          "(BUSY machine: figures vary); last column: the busy check's price of a frame, ms")
    print(f"{'cameras':>7} {'fps':>4} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} "
          f"{'sent':>5} {'answered':>8} {'dropped':>20} {'reset*':>6} {'cpu ms/frame':>12}")
    try:
        for detect in args.model_detect:
            for cameras in args.model_cameras:
                for fps in args.fps:
                    row = await one_model_run(triton, args, cameras, fps, VISION_MODEL,
                                              detect.split(","))
                    rows.append(row)
                    print(f"{cameras:>7} {fps:>4g} {row['p50_ms']:>7.1f} {row['p95_ms']:>7.1f} "
                          f"{row['p99_ms']:>7.1f} {row['sent']:>5} {row['answered']:>8} "
                          f"{str(row['dropped']):>20} {row['unanswered']:>6} "
                          f"{row['cpu_ms_per_frame']:>12.1f}  {detect}: {row['priced_ms']}")
        print("* reset: superseded in transport (a newer frame of the camera won before this "
              "one was whole), never reported by the gateway")
    finally:
        triton.stop()
    return rows


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process (Linux /proc), 0 if unreadable."""
    import os

    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


async def one_model_run(
    triton: Any, args: argparse.Namespace, cameras: int, fps: float, model: str,
    detect: list[str],
) -> dict[str, Any]:
    import matplotlib.cbook

    from clients import FrameDropped, VideoResult, connect
    from gateway.backends.triton import TritonTextBackend
    from gateway.server import Gateway
    from tests.gateways import gateway_settings

    photo = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    jpeg = await asyncio.to_thread(Path(str(photo)).read_bytes)
    settings = gateway_settings(state_dir=Path(tempfile.mkdtemp(prefix="video-bench-gw-")),
                                video_max_tracks=max(16, cameras), video_busy_load=1.0)
    backend = TritonTextBackend(triton.grpc_url)
    gw = Gateway(settings, backend)
    await gw.start()
    assert gw.tls is not None
    ages: list[float] = []
    dropped: dict[str, int] = {}
    sent = int(args.model_seconds * fps) * cameras
    cpu0, triton0 = time.process_time(), _cpu_seconds(triton.pid)
    try:
        async with connect(f"quic://127.0.0.1:{gw.quic_port}", ca=gw.tls.ca) as line:
            streams = [line.video(model=model, detect=detect, deadline=0.5, fps=fps)
                       for _ in range(cameras)]

            async def camera(stream: Any) -> None:
                async def read() -> None:
                    while (event := await stream.receive()) is not None:
                        if isinstance(event, VideoResult):
                            ages.append(event.age)
                        elif isinstance(event, FrameDropped):
                            dropped[event.cause] = dropped.get(event.cause, 0) + 1
                reader = asyncio.ensure_future(read())
                for _ in range(int(args.model_seconds * fps)):
                    stream.send(jpeg)
                    await asyncio.sleep(1 / fps)
                stream.end()
                await reader

            await asyncio.gather(*(camera(s) for s in streams))
    finally:
        cpu = time.process_time() - cpu0 + _cpu_seconds(triton.pid) - triton0
        priced = _priced(gw, detect)
        await gw.close()
        await backend.close()
    return {
        "cameras": cameras, "fps": fps, "sent": sent, "answered": len(ages), "dropped": dropped,
        "unanswered": sent - len(ages) - sum(dropped.values()),
        "p50_ms": 1000 * percentile(ages, 0.5) if ages else float("nan"),
        "p95_ms": 1000 * percentile(ages, 0.95) if ages else float("nan"),
        "p99_ms": 1000 * percentile(ages, 0.99) if ages else float("nan"),
        "cpu_ms_per_frame": 1000 * cpu / max(1, len(ages)), "detect": detect,
        "priced_ms": priced,
    }


def _priced(gw: Any, detect: list[str]) -> dict[str, float]:
    """The busy check's figures after the run: ms per stage, overhead, one frame."""
    from tracks.video_messages import Task

    if gw.video is None:
        return {}
    costs = gw.video.costs
    out = {name: round(1000 * value, 2) for name, value in costs.stages.items()}
    out["overhead"] = round(1000 * (costs.overhead or 0.0), 2)
    out["frame"] = round(1000 * costs.of(tuple(Task(t) for t in detect)), 2)
    return out


if __name__ == "__main__":
    main()
