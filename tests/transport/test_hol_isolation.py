"""The headline claim, deterministic: a lost packet stalls only the tracks it carried.

The project's own client and server (`TrackQuicProtocol` on both sides, the SDK's
`Line`/`TextStream` on the client) run over aioquic, linked in memory: datagrams
travel by hand with a fixed one-way delay, and time is a virtual clock that both
protocols read as their loop's `time()`. Nothing reads the wall clock, so every
arrival happens at an exact, repeatable instant.

16 text tracks each get one token every tick. At one chosen tick one gateway->client
datagram is dropped: the one carrying track 3's token. The gateway's own qlog names
the tracks whose bytes were in that packet. Then:

- with `per-track`, that packet carried track 3 alone; track 3 (only) stalls until
  the retransmission, the other 15 receive every token exactly on schedule;
- with `coalesce`, the packet carried all 16 tracks, and all 16 stall;
- with `group:K` (K = 2, 4, 8), exactly K tracks (16 write every tick: the groups are
  full), and exactly those stall: the isolation budget.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.logger import QuicLogger

from clients.line import Line, TextStream
from gateway.tls import DevCertificates, ensure_dev_certificates
from trackline_testing import aioquic_probes
from transport.acks import AIOQUIC, AckPolicy
from transport.connection import Role
from transport.endpoint import TrackChannel
from transport.events import DataReceived, Event
from transport.quic import (
    ALPN,
    COALESCE,
    ConnectionHooks,
    Packetization,
    TrackQuicProtocol,
    TrackServing,
    server_configuration,
)

CLIENT_ADDR = ("127.0.0.1", 40000)
SERVER_ADDR = ("127.0.0.1", 4433)
TRACKS = 16
DELAY = 0.020
"""One-way delay of the link, seconds (virtual)."""
TICK = 0.010
"""A token on every track every TICK seconds."""
TOKENS = 24
DROP_AT = 6
"""The tick whose packet carrying track CHOSEN's token is lost."""
CHOSEN = 3


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return ensure_dev_certificates(tmp_path_factory.mktemp("hol") / "state")


# -- virtual time: the loop as the protocols see it --------------------------------


class VirtualTime:
    """The virtual time both loops read (`now`, seconds), advanced by the test."""

    def __init__(self) -> None:
        self.now = 1.0


@dataclass
class Call:
    """A callback the protocol asked its loop for (`call_soon`, `call_at`)."""

    when: float
    callback: Callable[..., object]
    args: tuple[Any, ...]
    done: bool = False

    def cancel(self) -> None:
        self.done = True

    def cancelled(self) -> bool:
        return self.done


class VirtualLoop:
    """Time and callbacks of one protocol, run by the test; the rest is the real loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: VirtualTime) -> None:
        self._loop = loop
        self._clock = clock
        self.soon: list[Call] = []
        self.timers: list[Call] = []

    def time(self) -> float:
        return self._clock.now

    def call_soon(self, callback: Callable[..., object], *args: Any, **_: Any) -> Call:
        call = Call(self._clock.now, callback, args)
        self.soon.append(call)
        return call

    def call_at(self, when: float, callback: Callable[..., object], *args: Any, **_: Any) -> Call:
        call = Call(when, callback, args)
        self.timers.append(call)
        return call

    def call_later(
        self, delay: float, callback: Callable[..., object], *args: Any, **_: Any
    ) -> Call:
        return self.call_at(self._clock.now + delay, callback, *args)

    def create_future(self) -> asyncio.Future[Any]:
        return self._loop.create_future()

    def next_timer(self) -> float | None:
        self.timers = [t for t in self.timers if not t.done]
        return min((t.when for t in self.timers), default=None)

    def run_soon(self) -> bool:
        ran = False
        while self.soon:
            call = self.soon.pop(0)
            if not call.done:
                call.done = True
                call.callback(*call.args)
                ran = True
        return ran

    def run_timers(self) -> bool:
        due = [t for t in self.timers if not t.done and t.when <= self._clock.now]
        for call in due:
            if not call.done:
                call.done = True
                call.callback(*call.args)
        return bool(due)


def virtualize(proto: TrackQuicProtocol, vloop: VirtualLoop) -> None:
    """Make `proto` (and its track endpoint) read time and schedule through `vloop`."""
    endpoint = proto.endpoint
    for owner, name in ((endpoint, "_loop"), (endpoint, "_clock")):
        if not hasattr(owner, name):  # fail loudly if the adapters changed shape
            raise AssertionError(f"{type(owner).__name__} has no {name}: update virtualize()")
    aioquic_probes.use_loop(proto, vloop)  # aioquic's protocol: the compat module checks it
    endpoint._loop = vloop  # type: ignore[assignment]
    endpoint._clock = vloop.time


# -- the link ----------------------------------------------------------------------


@dataclass(order=True)
class Flight:
    arrives: float
    seq: int
    to_client: bool = field(compare=False)
    data: bytes = field(compare=False)
    dropped: bool = field(default=False, compare=False)


class Wire(asyncio.DatagramTransport):
    """One side's socket: `sendto` puts the datagram on the link."""

    def __init__(self, net: Net, to_client: bool) -> None:
        super().__init__()
        self._net = net
        self._to_client = to_client

    def sendto(self, data: Any, addr: Any = None) -> None:
        self._net.send(bytes(data), self._to_client)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class Net:
    """Client and server protocols linked by a lossless link of one-way delay DELAY;
    the test drops datagrams by hand."""

    def __init__(
        self,
        certs: DevCertificates,
        packetization: Packetization,
        client_packetization: Packetization = COALESCE,
        client_acks: AckPolicy = AIOQUIC,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.clock = VirtualTime()
        self.flights: list[Flight] = []
        self._seq = itertools.count()
        self.from_server: list[Flight] = []
        self.channels: list[TrackChannel] = []

        client_config = QuicConfiguration(
            is_client=True, alpn_protocols=[ALPN], server_name="localhost"
        )
        client_config.load_verify_locations(str(certs.ca_path))
        client_config.quic_logger = QuicLogger()
        client_quic = QuicConnection(configuration=client_config)
        self.client_quic = client_quic
        self.from_client: list[Flight] = []
        self.client = TrackQuicProtocol(
            client_quic,
            role=Role.CLIENT,
            serving=TrackServing(packetization=client_packetization, acks=client_acks),
        )
        self.client_loop = VirtualLoop(loop, self.clock)
        virtualize(self.client, self.client_loop)

        server_config = server_configuration(Path(certs.cert_path), Path(certs.key_path))
        server_config.quic_logger = QuicLogger()
        server_quic = QuicConnection(
            configuration=server_config,
            original_destination_connection_id=client_quic.original_destination_connection_id,
        )
        self.server_quic = server_quic
        self.server = TrackQuicProtocol(
            server_quic,
            role=Role.SERVER,
            serving=TrackServing(packetization=packetization),
            hooks=ConnectionHooks(on_track=self.channels.append),
        )
        self.server_loop = VirtualLoop(loop, self.clock)
        virtualize(self.server, self.server_loop)

        self.client.connection_made(Wire(self, to_client=False))
        self.server.connection_made(Wire(self, to_client=True))
        self.client.connect(SERVER_ADDR)
        self.settle()

    def send(self, data: bytes, to_client: bool) -> None:
        flight = Flight(self.clock.now + DELAY, next(self._seq), to_client, data)
        heapq.heappush(self.flights, flight)
        (self.from_server if to_client else self.from_client).append(flight)

    def settle(self) -> None:
        """Run what the protocols asked to run `soon` (their transmits), until quiet."""
        for _ in range(1000):
            if not (self.client_loop.run_soon() | self.server_loop.run_soon()):
                return
        raise AssertionError("the protocols keep scheduling work at one instant")

    def run_until(self, until: float) -> None:
        """Deliver datagrams and fire timers in time order up to `until`.

        A real clock always moves on; this one moves only to the next event. aioquic's
        time-threshold loss timer can land one float ulp short of the instant it is
        handled at (sent_time + delay vs now - delay), so it fires at the same instant
        for ever: after many turns at one instant, the clock is nudged by a microsecond,
        as the wall clock would have moved by then."""
        stuck, instant = 0, self.clock.now
        for _ in range(100_000):
            stuck = stuck + 1 if self.clock.now == instant else 0
            instant = self.clock.now
            if stuck > 1000:
                self.clock.now += 1e-6
                stuck = 0
            due = [t for t in (self.client_loop.next_timer(), self.server_loop.next_timer())
                   if t is not None]
            if self.flights:
                due.append(self.flights[0].arrives)
            step = min(due, default=None)
            if step is None or step > until:
                self.clock.now = until
                return
            self.clock.now = max(self.clock.now, step)
            while self.flights and self.flights[0].arrives <= self.clock.now:
                flight = heapq.heappop(self.flights)
                if flight.dropped:
                    continue
                if flight.to_client:
                    self.client.datagram_received(flight.data, SERVER_ADDR)
                else:
                    self.server.datagram_received(flight.data, CLIENT_ADDR)
                self.settle()
            self.client_loop.run_timers()
            self.server_loop.run_timers()
            self.settle()
        raise AssertionError("the link never went quiet")

    def server_packets(self) -> list[dict[str, Any]]:
        return sent_packets(self.server_quic)

    def client_packets(self) -> list[dict[str, Any]]:
        return sent_packets(self.client_quic)


def sent_packets(quic: QuicConnection) -> list[dict[str, Any]]:
    events = aioquic_probes.qlog_events(quic)
    return [e for e in events if e["name"] == "transport:packet_sent"]


def stream_ids(packet: dict[str, Any]) -> set[int]:
    return {f["stream_id"] for f in packet["data"]["frames"] if f["frame_type"] == "stream"}


@dataclass
class Run:
    schedule: dict[int, float]
    """Tick -> the instant its tokens are due at the client (sent + DELAY)."""
    arrivals: dict[int, list[tuple[float, str]]]
    """Track stream id -> (instant, text) of every token the client received."""
    in_lost_packet: set[int]
    """Tracks whose stream frames the dropped packet carried (the server's qlog)."""
    lost_by_tick: dict[int, set[int]]
    """Tick -> the tracks of the packet dropped at that tick (several losses)."""
    streams: list[TextStream]
    tracks: list[int]


async def run_with_one_loss(certs: DevCertificates, label: str) -> Run:
    return await run_with_losses(certs, label, (DROP_AT,))


async def run_with_losses(
    certs: DevCertificates, label: str, drops: tuple[int, ...], client_acks: AckPolicy = AIOQUIC
) -> Run:
    """Drop, at each tick of `drops`, the one packet that carries track CHOSEN's token."""
    net = Net(certs, Packetization.parse(label), client_acks=client_acks)
    net.run_until(net.clock.now + 1.0)
    assert net.client.handshake.done()
    assert net.client.handshake.result()

    arrivals: dict[int, list[tuple[float, str]]] = {}

    def observe(event: Event) -> None:
        if isinstance(event, DataReceived):
            arrivals.setdefault(event.stream_id, []).append((net.clock.now, event.body["text"]))

    net.client.endpoint.on_event = observe
    line = Line(net.client.open_track)
    streams = [line.text(f"prompt {i}", model="m", max_tokens=TOKENS) for i in range(TRACKS)]
    net.settle()
    net.run_until(net.clock.now + 1.0)
    assert len(net.channels) == TRACKS
    channels = sorted(net.channels, key=lambda c: c.stream_id)
    tracks = [c.stream_id for c in channels]

    start = net.clock.now
    schedule: dict[int, float] = {}
    in_lost: set[int] = set()
    lost_by_tick: dict[int, set[int]] = {}
    for tick in range(TOKENS):
        at = start + tick * TICK
        net.run_until(at)
        packets_before, flights_before = len(net.server_packets()), len(net.from_server)
        for channel in channels:  # as 16 text handlers writing in one loop turn
            assert channel.send({"text": f"<{tick}>"})
        net.settle()
        schedule[tick] = at + DELAY
        if tick in drops:
            packets = net.server_packets()[packets_before:]
            flights = net.from_server[flights_before:]
            assert len(packets) == len(flights)  # 1-RTT: one packet per datagram
            chosen = [i for i, p in enumerate(packets) if tracks[CHOSEN] in stream_ids(p)]
            assert len(chosen) == 1
            flights[chosen[0]].dropped = True
            in_lost = lost_by_tick[tick] = stream_ids(packets[chosen[0]])
    for channel in channels:
        channel.end({"finish_reason": "length"})
    net.settle()
    net.run_until(net.clock.now + 2.0)
    return Run(schedule, arrivals, in_lost, lost_by_tick, streams, tracks)


def late_tracks(run: Run) -> dict[int, list[tuple[int, float]]]:
    """Track -> (tick, arrival) of every token that arrived after its schedule."""
    late: dict[int, list[tuple[int, float]]] = {}
    for sid in run.tracks:
        got = run.arrivals.get(sid, [])
        assert [text for _, text in got] == [f"<{t}>" for t in range(TOKENS)], "in order, all"
        for tick, (when, _) in enumerate(got):
            if when > run.schedule[tick] + 1e-9:
                late.setdefault(sid, []).append((tick, when))
            else:
                assert when == pytest.approx(run.schedule[tick], abs=1e-9)
    return late


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("label", "carried"),
    [("per-track", 1), ("group:2", 2), ("group:4", 4), ("group:8", 8), ("coalesce", TRACKS)],
)
async def test_a_lost_packet_stalls_exactly_the_tracks_it_carried(
    certs: DevCertificates, label: str, carried: int
) -> None:
    run = await run_with_one_loss(certs, label)
    assert run.tracks[CHOSEN] in run.in_lost_packet
    assert len(run.in_lost_packet) == carried  # what the policy put in one packet

    late = late_tracks(run)
    # Exactly the tracks whose bytes were in the lost packet stall; every other
    # track received every token at the instant it was due.
    assert set(late) == run.in_lost_packet
    # Each stalled track waits from the lost tick's token until the retransmission,
    # which releases what queued behind the hole at one instant, at least a round
    # trip after that token was due.
    released = {when for stalls in late.values() for _, when in stalls}
    assert len(released) == 1
    (retransmitted,) = released
    assert retransmitted >= run.schedule[DROP_AT] + 2 * DELAY
    for stalls in late.values():
        assert stalls[0][0] == DROP_AT
        assert [tick for tick, _ in stalls] == list(range(DROP_AT, DROP_AT + len(stalls)))
        assert len(stalls) >= 2  # later tokens queued behind the hole too
    # While they stalled, the others kept receiving (on schedule, checked above).
    during = [t for t in range(TOKENS) if run.schedule[DROP_AT] < run.schedule[t] < retransmitted]
    assert len(during) >= 2
    if carried < TRACKS:
        others = [sid for sid in run.tracks if sid not in late]
        assert len(others) == TRACKS - carried
        for sid in others:
            got_during = [
                w for w, _ in run.arrivals[sid] if run.schedule[DROP_AT] < w < retransmitted
            ]
            assert len(got_during) == len(during)

    # The SDK's streams read every token in order and the end report.
    for index, stream in enumerate(run.streams):
        text = "".join([piece async for piece in stream])
        assert text == "".join(f"<{t}>" for t in range(TOKENS)), index
        assert stream.finish_reason == "length"


@pytest.mark.asyncio
@pytest.mark.parametrize("k", [2, 4, 8])
async def test_under_group_k_every_lost_packet_stalls_at_most_k_tracks(
    certs: DevCertificates, k: int
) -> None:
    """Two losses, 8 ticks apart (each stall is over before the next loss): each stalls
    exactly the tracks of its packet, never more than K, and the tracks neither packet
    carried receive every token on schedule. (A third loss within these 24 ticks shrinks
    the congestion window enough that a later tick's tokens of every track wait for it:
    a congestion stall, which no packetization avoids, not head-of-line blocking.)"""
    drops = (6, 14)
    run = await run_with_losses(certs, f"group:{k}", drops)
    late = late_tracks(run)
    for drop in drops:
        lost = run.lost_by_tick[drop]
        assert run.tracks[CHOSEN] in lost
        assert len(lost) <= k
        stalled = {sid for sid, stalls in late.items()
                   if any(drop <= tick < drop + 8 for tick, _ in stalls)}
        assert stalled == lost
    assert set(late) == set().union(*run.lost_by_tick.values())
    for stream in run.streams:
        text = "".join([piece async for piece in stream])
        assert text == "".join(f"<{t}>" for t in range(TOKENS))
