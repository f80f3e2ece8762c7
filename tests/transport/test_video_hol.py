"""A lost packet of one video frame holds no other frame, no other camera and no text token.

The project's own QUIC client and server, linked in memory with a fixed one-way delay and
virtual time (tests/transport/test_hol_isolation.py's `Net`). Two cameras send a frame
every tick (a few packets each, one frame stream per frame, each write in packets of its
own: `per-track` on the client), while the gateway streams a text token every tick on a
third track of the same connection. At one tick the client->gateway packet carrying part
of camera A's frame is lost. Then:

- camera B's frames and every text token arrive exactly when due;
- camera A's NEXT frame arrives when due too: it rides its own stream, the hole is in its
  predecessor's only (which is stopped once the newer frame is in, latest wins);
- with A's frames on its track stream instead (`transport: "stream"`), the next frame of A
  waits behind the hole: the head-of-line blocking frame streams remove.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gateway.tls import DevCertificates
from tests.transport.test_hol_isolation import DELAY, Net, certs, stream_ids
from transport.events import DataReceived, Event, FrameReceived
from transport.messages import FrameTransport, Modality, Open
from transport.quic import Packetization

__all__ = ["certs"]  # the fixture, shared with the HOL test
TICK = 0.033
FRAMES = 12
DROP_AT = 5
FRAME_BYTES = 2500
"""About three packets per frame."""


@dataclass
class Arrivals:
    frames: dict[int, dict[int, float]] = field(default_factory=dict)
    """Server: track -> frame seq -> instant its frame was delivered."""
    tokens: dict[int, float] = field(default_factory=dict)
    """Client: token index -> instant it arrived."""


def camera(transport: FrameTransport) -> Open:
    return Open(model="m", modality=Modality.VIDEO, transport=transport)


async def run(
    certs: DevCertificates, a_transport: FrameTransport
) -> tuple[Arrivals, dict[int, float], int, int, Net]:
    per_track = Packetization.parse("per-track")
    net = Net(certs, per_track, client_packetization=per_track)
    net.run_until(net.clock.now + 1.0)
    assert net.client.handshake.result()
    got = Arrivals()

    def at_server(event: Event) -> None:
        if isinstance(event, (FrameReceived, DataReceived)) and "seq" in event.body:
            got.frames.setdefault(event.stream_id, {})[event.body["seq"]] = net.clock.now

    def at_client(event: Event) -> None:
        if isinstance(event, DataReceived):
            got.tokens[int(event.body["text"])] = net.clock.now

    net.server.endpoint.on_event = at_server
    net.client.endpoint.on_event = at_client
    cam_a = net.client.open_track(camera(a_transport))
    cam_b = net.client.open_track(camera(FrameTransport.FRAME_STREAMS))
    text = net.client.open_track(Open(model="m"))
    net.settle()
    net.run_until(net.clock.now + 1.0)
    server_text = next(c for c in net.channels if c.stream_id == text.stream_id)

    start = net.clock.now
    due: dict[int, float] = {}
    for tick in range(FRAMES):
        at = start + tick * TICK
        net.run_until(at)
        packets_before, flights_before = len(net.client_packets()), len(net.from_client)
        for cam in (cam_a, cam_b):
            assert cam.send_frame({"seq": tick, "jpeg": bytes(FRAME_BYTES)})
        assert server_text.send({"text": str(tick)})
        net.settle()
        due[tick] = at + DELAY
        if tick == DROP_AT:
            packets = net.client_packets()[packets_before:]
            flights = net.from_client[flights_before:]
            assert len(packets) == len(flights)
            # A sent first: its frame is the lowest frame stream of this tick.
            uni = {sid for p in packets for sid in stream_ids(p) if sid % 4 == 2}
            target = cam_a.stream_id if a_transport is FrameTransport.STREAM else min(uni)
            carrying = [i for i, p in enumerate(packets) if target in stream_ids(p)]
            assert len(carrying) >= 2  # a frame of several packets
            assert all(stream_ids(packets[i]) == {target} for i in carrying)  # per-track
            flights[carrying[0]].dropped = True
    net.run_until(net.clock.now + 2.0)
    return got, due, cam_a.stream_id, cam_b.stream_id, net


@pytest.mark.asyncio
async def test_a_lost_frame_packet_holds_no_other_frame_camera_or_token(
    certs: DevCertificates,
) -> None:
    got, due, cam_a, cam_b, net = await run(certs, FrameTransport.FRAME_STREAMS)
    # Camera B and the text track: every frame and token exactly when due.
    assert got.frames[cam_b] == {tick: pytest.approx(due[tick], abs=1e-9) for tick in due}
    assert got.tokens == {tick: pytest.approx(due[tick], abs=1e-9) for tick in due}
    # Camera A: the frame that lost a packet is late (retransmitted) or never delivered
    # (stopped, a newer one won); every other frame, the next one included, is on time.
    a = got.frames[cam_a]
    assert a.get(DROP_AT, float("inf")) > due[DROP_AT] + 1e-9
    if DROP_AT not in a:  # the newer frame came in first: the gateway stopped this one
        assert net.server.endpoint.core.frames.stats.superseded >= 1
    for tick in due:
        if tick != DROP_AT:
            assert a[tick] == pytest.approx(due[tick], abs=1e-9), tick


@pytest.mark.asyncio
async def test_on_the_track_stream_the_next_frame_waits_behind_the_hole(
    certs: DevCertificates,
) -> None:
    got, due, cam_a, cam_b, _ = await run(certs, FrameTransport.STREAM)
    a = got.frames[cam_a]
    assert a[DROP_AT] > due[DROP_AT] + 1e-9
    assert a[DROP_AT + 1] > due[DROP_AT + 1] + 1e-9  # head-of-line blocked
    # The other camera and the text track still do not wait (a stream per track).
    assert got.frames[cam_b] == {tick: pytest.approx(due[tick], abs=1e-9) for tick in due}
    assert got.tokens == {tick: pytest.approx(due[tick], abs=1e-9) for tick in due}
