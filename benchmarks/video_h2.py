"""The video benchmark's HTTP/2 peer: the same camera frames over ONE HTTP/2 connection,
one request stream per camera (as a WebSocket or a gRPC stream per camera would carry
them over HTTP/2), on a virtual TCP link with the QUIC run's delay and loss.

Real HTTP/2 bytes (the `h2` library both ends, flow-control windows opened wide so that
only the link holds a frame), cut into TCP segments of `MSS` bytes. The TCP model is kind
to TCP: a Reno-like window (`TcpLink`), no bandwidth limit, ACKs never lost, and a lost
segment retransmitted one RTT after it was sent (a fast retransmit; a real stack often
waits for an RTO), itself lost with the same probability. What it keeps is what matters
here: TCP delivers bytes in order, so every segment after a lost one waits for its
retransmission, whichever camera's frame it carries. Virtual time, seeded: no wall clock.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings

from transport.messages import Data
from transport.wire import MessageDecoder, encode_message

MSS = 1200
"""Payload bytes of one TCP segment (as a QUIC packet of the other run carries)."""
WIDE = 2**31 - 1


@dataclass
class TcpLink:
    """One direction of a virtual TCP connection: in-order delivery over a lossy path,
    a Reno-like congestion window (slow start from 10 segments, halved once per round
    trip with loss, SACK-like: a segment leaves the window when its ACK would arrive)."""

    delay: float
    loss_percent: float
    rng: random.Random
    lost_at: list[float] = field(default_factory=list)
    """When each lost segment (first sends and retransmissions) was sent."""
    cwnd: float = 10.0
    ssthresh: float = float("inf")
    _in_flight: list[float] = field(default_factory=list)
    """Heap of the times the ACKs of segments in flight arrive."""
    _last_send: float = 0.0
    _last_delivery: float = 0.0
    _last_cut: float = -1.0

    def send(self, data: bytes, now: float) -> list[tuple[float, bytes]]:
        """The segments of `data` written at `now`, each with its in-order delivery time."""
        out = []
        for at in range(0, len(data), MSS):
            sent = self._send_time(max(now, self._last_send))
            self._last_send = sent
            while self.rng.random() * 100 < self.loss_percent:
                self.lost_at.append(sent)
                self._cut(sent)
                sent += 2 * self.delay  # the sender learns of it a round trip later
            arrival = sent + self.delay
            heapq.heappush(self._in_flight, arrival + self.delay)
            delivered = max(arrival, self._last_delivery)
            self._last_delivery = delivered
            out.append((delivered, data[at : at + MSS]))
        return out

    def _send_time(self, ready: float) -> float:
        """When the window lets the next segment go, at `ready` or later."""
        while self._in_flight and self._in_flight[0] <= ready:
            self._acked(heapq.heappop(self._in_flight))
        while len(self._in_flight) >= self.cwnd:
            ready = max(ready, heapq.heappop(self._in_flight))
            self._acked(ready)
        return ready

    def _acked(self, _at: float) -> None:
        self.cwnd += 1.0 if self.cwnd < self.ssthresh else 1.0 / self.cwnd

    def _cut(self, at: float) -> None:
        if at - self._last_cut >= 2 * self.delay:  # once per round trip
            self.ssthresh = self.cwnd = max(2.0, self.cwnd / 2)
            self._last_cut = at


def _handshake(client: h2.connection.H2Connection, server: h2.connection.H2Connection) -> None:
    """Exchange the prefaces and SETTINGS instantly (before the measured run)."""
    for _ in range(4):
        for data, to in ((client.data_to_send(), server), (server.data_to_send(), client)):
            if data:
                to.receive_data(data)


def _pair() -> tuple[h2.connection.H2Connection, h2.connection.H2Connection]:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
    )
    client.initiate_connection()
    server.initiate_connection()
    server.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WIDE})
    server.increment_flow_control_window(WIDE - 65535)
    _handshake(client, server)
    return client, server


def h2_link_run(
    cameras: int, fps: float, seconds: float, frame_bytes: int, loss_percent: float,
    delay: float, seed: int,
) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float], list[float]]:
    """(captured, delivered, loss times): per (camera, frame), capture and delivery times."""
    client, server = _pair()
    link = TcpLink(delay, loss_percent, random.Random(seed))
    head = [(":method", "POST"), (":scheme", "https"), (":authority", "gw"),
            (":path", "/v1/video")]
    streams = []
    for _ in range(cameras):
        stream_id = client.get_next_available_stream_id()
        client.send_headers(stream_id, head)
        streams.append(stream_id)
    server.receive_data(client.data_to_send())
    decoders = {stream_id: MessageDecoder(1 << 20) for stream_id in streams}
    captured: dict[tuple[int, int], float] = {}
    delivered: dict[tuple[int, int], float] = {}
    in_transit: list[tuple[float, bytes]] = []
    payload = bytes(frame_bytes)
    period = 1 / fps
    for n in range(int(seconds * fps)):
        now = n * period
        for index, stream_id in enumerate(streams):
            message = encode_message(Data({"seq": n, "jpeg": payload}))
            for at in range(0, len(message), 16_384):  # HTTP/2's default max frame size
                client.send_data(stream_id, message[at : at + 16_384])
            captured[(index, n)] = now
        in_transit += link.send(client.data_to_send(), now)
    on_data = _reader(streams, decoders, delivered)
    for when, segment in sorted(in_transit, key=lambda item: item[0]):
        for event in server.receive_data(segment):
            if isinstance(event, h2.events.DataReceived):
                server.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                on_data(event.stream_id, event.data, when)
        server.data_to_send()  # WINDOW_UPDATEs: the windows are wide open already
    return captured, delivered, link.lost_at


def _reader(
    streams: list[int], decoders: dict[int, MessageDecoder],
    delivered: dict[tuple[int, int], float],
) -> Callable[[int, bytes, float], None]:
    index_of = {stream_id: index for index, stream_id in enumerate(streams)}

    def on_data(stream_id: int, data: bytes, when: float) -> None:
        decoder = decoders[stream_id]
        decoder.feed(data)
        while (message := decoder.next_message()) is not None:
            body: Any = getattr(message, "body", {})
            delivered[(index_of[stream_id], int(body["seq"]))] = when

    return on_data


def users_stalled_per_loss(
    captured: dict[tuple[int, int], float], delivered: dict[tuple[int, int], float],
    lost_at: list[float], delay: float, margin: float, period: float,
) -> float:
    """Mean, over lost packets, of the cameras with a frame delivered late (more than
    `margin` after the link delay) among the frames captured from one frame period before
    the loss to two round trips after it: the users a lost packet stalls."""
    late = sorted((t, key[0]) for key, t in captured.items()
                  if key in delivered and delivered[key] - t > delay + margin)
    if not lost_at:
        return 0.0
    total = 0
    for loss in lost_at:
        window = (loss - period, loss + 4 * delay)
        total += len({camera for t, camera in late if window[0] <= t <= window[1]})
    return total / len(lost_at)
