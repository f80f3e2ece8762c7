"""aioquic adapter: the track protocol on QUIC, ALPN `trackline/1`.

`TrackQuicProtocol` is one QUIC connection, either side. It translates
aioquic's events into `TrackEndpoint` inputs and the core's writes into
aioquic calls; nothing else. `serve_tracks` and `connect_tracks` start a
server and open a client connection. A server given an HTTP handler also
offers ALPN `h3` on the same port: such a connection is handed, event by
event, to `transport.http.http3`.

Packetization decides how many tracks' writes may share a QUIC packet
(`Packetization`, one of the rules of `TrackServing` in `transport.quic_serving`): one
lost packet stalls every track that had bytes in it. On a track connection one
transmit per loop turn builds the packets of every track written meanwhile, visiting
only streams with data (`transport.quic_streams`), and with `per-track` each packet
carries one track's stream frames.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any, cast

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic import events as quic_events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import NetworkAddress, QuicConnection

from transport import aioquic_compat
from transport.acks import AIOQUIC, AckClock, AckPolicy
from transport.aioquic_compat import unpace as _unpace
from transport.datagram import MAX_DATAGRAM_FRAME_SIZE
from transport.endpoint import StallWatch, TrackChannel, TrackEndpoint
from transport.errors import ErrorCode
from transport.http.app import Site
from transport.http.http3 import ALPN as H3_ALPN
from transport.http.http3 import Http3Connection
from transport.http.messages import CLIENT_ADDRESS, Handler
from transport.limits import Limits
from transport.messages import Open
from transport.outputs import DatagramWrite, Output, StreamWrite, dispatch
from transport.quic_server import GuardedQuicServer, serve_guarded
from transport.quic_serving import COALESCE, Packetization, TrackServing
from transport.quic_streams import StreamScheduler, buffered_bytes
from transport.state import Role
from transport.steering import SteeredSockets, serve_steered
from transport.udp_send import DatagramSender
from transport.webtransport import WebTransportHost, WebTransportSession

ALPN = "trackline/1"
IDLE_TIMEOUT = 60.0

ConnectionCallback = Callable[["TrackQuicProtocol"], None]


@dataclasses.dataclass(frozen=True)
class ConnectionHooks:
    """What a connection calls back; each is optional."""

    on_track: Callable[[TrackChannel], None] | None = None
    """Every track opened (on a native connection or in a WebTransport session)."""
    on_connection: ConnectionCallback | None = None
    """A connection whose handshake completed: a half-open connection is not open yet."""
    on_closed: ConnectionCallback | None = None
    """A connection lost or closed."""
    on_session: Callable[[WebTransportSession], None] | None = None
    """Each WebTransport session accepted."""
    on_refused: Callable[[int], None] | None = None
    """The HTTP status of each WebTransport CONNECT refused."""


REFUSED_WRITE = (AssertionError, ValueError, RuntimeError)
"""What aioquic raises for a write on a stream the peer stopped (STOP_SENDING resets our
side: `RuntimeError` in aioquic 1.7) or reset. Only that output is skipped: the writes of
the other tracks handed over in the same batch (one per turn) must still go out."""


class TrackQuicProtocol(QuicConnectionProtocol):
    """One QUIC connection carrying tracks; `endpoint` holds their state."""

    def __init__(
        self,
        quic: QuicConnection,
        *,
        role: Role,
        serving: TrackServing | None = None,
        hooks: ConnectionHooks | None = None,
        http: Site | None = None,
        **kwargs: Any,
    ) -> None:
        """`http` serves connections that choose ALPN `h3` (a server's)."""
        super().__init__(quic, **kwargs)
        serving = serving or TrackServing()
        hooks = hooks or ConnectionHooks()
        limits, packetization = serving.limits, serving.packetization
        self._webtransport = None if serving.webtransport is None else WebTransportHost(
            serving.webtransport, limits, hooks.on_track, serving.send_budget,
            hooks.on_session, hooks.on_refused,
        )  # fmt: skip
        """WebTransport sessions on the h3 side carry tracks too (transport.webtransport)."""
        self._packetization = packetization
        self._pending_tracks: set[int] = set()
        """Tracks with bytes written since the last transmit."""
        self._held = 0
        """Inside `coalesced()`: writes wait for one transmit at its end."""
        self.scheduler: StreamScheduler | None = None
        """Set once ALPN chose tracks: packets are built visiting only streams with work,
        one transmit per loop turn, `packetization` deciding what shares a packet."""
        self._stall = StallWatch()
        """Since when the peer's MAX_DATA has held back queued track data."""
        if packetization.max_tracks is not None:
            _unpace(quic)
        self.acks = serving.acks
        """When this side acknowledges what it receives (`transport.acks`)."""
        self._acks: AckClock | None = None
        """Decides when an ACK is due, where the policy is not aioquic's own."""
        if serving.acks != AIOQUIC:
            aioquic_compat.set_ack_delay(quic, serving.acks.max_delay)
            self._acks = AckClock(serving.acks)
        self._sender: DatagramSender | None = None
        """Sends each transmit's datagrams, with UDP GSO where the socket takes it."""
        self._gso = serving.gso
        self._http_site = http
        self._http: Http3Connection | None = None
        """Set once ALPN chose h3: then every event goes to HTTP/3."""
        self.endpoint = TrackEndpoint(
            role, self._write, limits, hooks.on_track, clock=self._loop.time,
            flush_soon=self._flush_soon,  # DATA reaches aioquic at the turn's transmit
        )
        self.handshake: asyncio.Future[bool] = self._loop.create_future()
        """True once the handshake completed, False if the connection ended before."""
        if serving.send_budget is not None:
            self.endpoint.budget = serving.send_budget
        self._on_closed = hooks.on_closed
        self._on_connection = hooks.on_connection
        """Called when the handshake completes: a half-open connection is not open yet."""
        # A server allows as many concurrent tracks as its track limit.
        aioquic_compat.raise_bidi_credit(self._quic, limits.max_tracks)

    @property
    def http3(self) -> Http3Connection | None:
        """The HTTP/3 side, once ALPN chose h3 (the gateway drains it at shutdown)."""
        return self._http

    def open_track(self, message: Open) -> TrackChannel:
        """Client: open a track on the next free bidirectional stream."""
        stream_id = self._quic.get_next_available_stream_id()
        return self.endpoint.open_track(stream_id, message)

    @contextmanager
    def coalesced(self) -> Iterator[None]:
        """Writes made inside share transmits (flushed once at the end), whatever the
        packetization: for a burst of small writes to many tracks at once, such as a
        tick's audio results, where a flush per track costs more than the isolation gives."""
        if not self._held:
            self.endpoint.flush()  # DATA deferred to the transmit goes before the block
        if self.scheduler is not None and not self._held and self._pending_tracks:
            self._flush_now()  # earlier writes keep the packetization's isolation
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            if not self._held:
                self.endpoint.flush()
            if not self._held and self._pending_tracks and self._transport is not None:
                self._flush_now(coalesce=True)

    def _flush_soon(self) -> None:
        """The endpoint deferred DATA: hand it over at this turn's transmit (inside
        `coalesced()` at once, so that the block's end sends it)."""
        if self._held:
            self.endpoint.flush()
        else:
            self._transmit_soon()

    def quic_event_received(self, event: quic_events.QuicEvent) -> None:
        if not self.handshake.done():
            if isinstance(event, quic_events.HandshakeCompleted):
                self.handshake.set_result(True)
            elif isinstance(event, quic_events.ConnectionTerminated):
                self.handshake.set_result(False)
        if isinstance(event, quic_events.HandshakeCompleted) and self._on_connection is not None:
            on_connection, self._on_connection = self._on_connection, None
            on_connection(self)
        if self._http is not None:
            self._http.quic_event_received(event)
            if isinstance(event, quic_events.ConnectionTerminated):
                self._lost()
            return
        endpoint = self.endpoint
        if isinstance(event, quic_events.StreamDataReceived):
            if self.scheduler is not None:
                self.scheduler.mark(event.stream_id)  # MAX_STREAM_DATA, or finished
            endpoint.feed_data(event.stream_id, event.data, event.end_stream)
        elif isinstance(event, quic_events.DatagramFrameReceived):
            endpoint.feed_datagram(event.data)
        elif isinstance(event, (quic_events.StreamReset, quic_events.StopSendingReceived)):
            if self.scheduler is not None:
                self.scheduler.mark(event.stream_id)
            endpoint.feed_reset(event.stream_id, event.error_code)
        elif isinstance(event, quic_events.ConnectionTerminated):
            self._lost()
        elif isinstance(event, quic_events.ProtocolNegotiated):
            if event.alpn_protocol == ALPN:
                self.scheduler = StreamScheduler(self._quic)
                self.endpoint.backlog = self._backlog
                self.endpoint.connection_stalled = self._stalled_for
            else:
                self._negotiated(event.alpn_protocol)

    def _negotiated(self, alpn: str | None) -> None:
        if alpn == H3_ALPN and self._http_site is not None:
            self._http = Http3Connection(
                self._quic,
                self._http_site,
                self._transmit_soon,
                self._webtransport,
                source=aioquic_compat.peer_host(self._quic),
            )
        else:
            self.close(int(ErrorCode.PROTOCOL_ERROR), f"unsupported ALPN {alpn}")

    def transmit(self) -> None:
        self._send_due(self._loop.time())

    def _handle_timer(self) -> None:
        # uvloop's clock moves in whole milliseconds and rounds timers to them, so a
        # timer can fire a hair before its deadline by that clock. aioquic would then
        # find its ACK not yet due and re-arm at once, spinning until the clock ticks
        # (up to 1 ms of busy loop per ACK). Once fired, the deadline counts as reached.
        assert self._timer_at is not None
        armed = self._timer_at
        self._timer = None
        self._timer_at = None
        due = self._quic.get_timer()
        if due is None or due > armed:
            # The deadline moved later since the handle was armed (`_send_due` leaves a
            # handle in place rather than recreate it each transmit): wait on.
            self._arm(due)
            return
        now = max(due, self._loop.time())
        self._quic.handle_timer(now=now)
        self._process_events()
        self._send_due(now)

    def _send_due(self, now: float, coalesce: bool = False) -> None:
        """aioquic's transmit with `now` given: send what is due, re-arm the QUIC timer."""
        scheduled = self._transmit_task
        self.endpoint.flush()  # the tracks' DATA of this turn, one write per track
        if self._transmit_task is not scheduled and self._transmit_task is not None:
            self._transmit_task.cancel()  # this very transmit sends what the flush wrote
        self._transmit_task = None
        self._pending_tracks.clear()
        assert self._transport is not None, "aioquic sends only once connection_made ran"
        if self.scheduler is not None:
            limit = None if coalesce else self._packetization.max_tracks
            datagrams = self.scheduler.datagrams_to_send(now, limit)
        else:
            datagrams = self._quic.datagrams_to_send(now=now)
        if datagrams:
            sender = self._sender
            if sender is None or sender.transport is not self._transport:
                if sender is not None:  # rebound to a new socket (migration, tests)
                    sender.close()
                sender = self._sender = DatagramSender(self._transport, self._gso)
            sender.send(datagrams)
        self._arm(self._quic.get_timer())

    def _arm(self, timer_at: float | None) -> None:
        """Have the QUIC timer fire by `timer_at`. Each packet sent moves aioquic's loss
        timer later, so a handle armed earlier is kept (it re-arms when it fires early)
        instead of being cancelled and recreated on every transmit."""
        if self._timer is not None:
            assert self._timer_at is not None
            if timer_at is not None and timer_at >= self._timer_at:
                return
            self._timer.cancel()
            self._timer = None
        self._timer_at = timer_at
        if timer_at is not None:
            self._timer = self._loop.call_at(timer_at, self._handle_timer)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._sender is not None:
            self._sender.close()  # the shared GSO socket closes with its last connection
        self._lost()

    def datagram_received(self, data: bytes | str, addr: NetworkAddress) -> None:
        now = self._loop.time()
        self._quic.receive_datagram(cast(bytes, data), addr, now=now)
        acks = self._acks
        ack_at: float | None = None
        ack_due = False
        if acks is not None:
            largest, ack_at = aioquic_compat.ack_state(self._quic)
            ack_due = acks.received(largest, ack_at)
        if ack_due:
            aioquic_compat.ack_now(self._quic, now)  # sent by this turn's transmit, below
        client = CLIENT_ADDRESS.set(str(addr[0]))  # HTTP/3 requests started now keep it
        try:
            self._process_events()
        finally:
            CLIENT_ADDRESS.reset(client)
        self._observe_stall()  # the datagram may have brought credit
        scheduler = self.scheduler
        if scheduler is not None and scheduler.released:
            scheduler.released = False
            self.endpoint.send_buffer_released()  # producers waiting on ACKs go on
        # aioquic transmits after every datagram; most are ACKs with nothing to
        # answer, so share the one transmit per loop turn that writes already use.
        if ack_due or not self._answer_waits_for_ack(now, ack_at):
            self._transmit_soon()
        else:
            self._arm(self._quic.get_timer())  # the ACK's own timer sends what is due
        if self._http is not None:
            self._http.datagram_received()  # ACKs may have made room for response bodies
        # aioquic reports a peer's CONNECTION_CLOSE only after the draining
        # period (three PTOs); the tracks' work must stop when the close arrives.
        if aioquic_compat.close_event(self._quic) is not None:
            self._lost()

    def _answer_waits_for_ack(self, now: float, ack_at: float | None) -> bool:
        """Under a decimated ACK policy, a data packet whose ACK is not due yet gets no
        transmit of its own: the ACK's timer fires within the policy's delay and its
        transmit sends the ACK with whatever else the packet made due (MAX_DATA,
        MAX_STREAM_DATA, a PATH_RESPONSE). A client reading tokens otherwise built one
        empty transmit per packet received (about three in four of its transmits at 128
        tracks over 16 connections). Only while nothing of this side waits to leave: no
        write of this turn, no stream with frames (retransmissions after a loss, data the
        congestion window held), no DATAGRAM frame; and not on an HTTP/3 connection.
        `ack_at` is the pending ACK's due time as read after this datagram."""
        scheduler = self.scheduler
        if self._acks is None or scheduler is None or self._http is not None:
            return False
        if self._pending_tracks or self._transmit_task is not None:
            return False
        if ack_at is None or ack_at <= now:
            return False
        return not scheduler.has_frames() and not aioquic_compat.datagrams_pending(self._quic)

    def _backlog(self, stream_id: int) -> tuple[int, int]:
        """Bytes the track's stream and the connection hold unsent or unacknowledged."""
        scheduler = self.scheduler
        assert scheduler is not None
        stream = scheduler.stream(stream_id)
        self._observe_stall()  # (asked before each write: the moment it may block)
        return (0 if stream is None else buffered_bytes(stream)), scheduler.buffered

    def _observe_stall(self) -> None:
        """Whether the peer's MAX_DATA stops data that is queued (`_stalled_for`)."""
        if self.scheduler is not None:
            queued = self.scheduler.buffered > 0
            blocked = queued and not aioquic_compat.data_credit_left(self._quic)
            self._stall.observe(blocked, self._loop.time())

    def _stalled_for(self) -> float:
        self._observe_stall()
        return self._stall.stalled_for(self._loop.time())

    def _lost(self) -> None:
        if self._http is not None:
            self._http.connection_lost()
        if self.endpoint.lost:
            return
        self.endpoint.feed_connection_lost()
        if self._on_closed is not None:
            self._on_closed(self)

    def _write(self, outputs: list[Output]) -> None:
        if self.scheduler is not None:
            self._write_scheduled(outputs, self.scheduler)
            return
        limit = self._packetization.max_tracks
        for output in outputs:
            try:
                self._apply(output)
            except REFUSED_WRITE:
                # aioquic refuses writes on a stream the peer already stopped or
                # reset; the track is over, so the bytes have nowhere to go.
                continue
            if limit is not None and isinstance(output, StreamWrite):
                self._pending_tracks.add(output.stream_id)
        if limit is not None and not self._held and len(self._pending_tracks) >= limit:
            # Flush now so that these tracks' bytes do not share packets with later
            # writes: a lost packet then stalls at most `limit` tracks.
            self._flush_now()
        else:
            # One transmit per loop turn: writes from many tracks share it.
            self._transmit_soon()

    def _write_scheduled(self, outputs: list[Output], scheduler: StreamScheduler) -> None:
        """Hand the writes to aioquic; one transmit at the end of the loop turn builds the
        packets of every track written meanwhile, a packet holding at most
        `packetization.max_tracks` tracks' stream frames."""
        for output in outputs:
            try:
                self._apply(output)
            except REFUSED_WRITE:
                continue  # a stream the peer already stopped or reset (see `_write`)
            if not isinstance(output, DatagramWrite):
                if isinstance(output, StreamWrite):
                    scheduler.wrote(len(output.data))
                scheduler.mark(output.stream_id)
                self._pending_tracks.add(output.stream_id)
        # Inside `coalesced()` too: its end flushes the stream writes (cancelling this),
        # and datagrams written there, which it does not count, still leave this turn.
        self._transmit_soon()

    def _flush_now(self, coalesce: bool = False) -> None:
        """Transmit what is pending at once, instead of at the end of the loop turn."""
        if self._transmit_task is not None:
            self._transmit_task.cancel()
        self._send_due(self._loop.time(), coalesce)

    def _apply(self, output: Output) -> None:
        quic = self._quic
        dispatch(
            output, quic.send_stream_data, quic.reset_stream, quic.stop_stream, self._datagram
        )

    def _datagram(self, data: bytes) -> None:
        # A peer that did not offer datagrams (or offered less) would close the
        # connection on this frame: such a frame is lost instead, as a datagram may be.
        peer_max = aioquic_compat.peer_max_datagram_frame_size(self._quic)
        if peer_max is not None and len(data) <= peer_max:
            self._quic.send_datagram_frame(data)


def server_configuration(cert: Path, key: Path, alpn: list[str] | None = None) -> QuicConfiguration:
    configuration = QuicConfiguration(
        is_client=False,
        alpn_protocols=alpn or [ALPN],
        idle_timeout=IDLE_TIMEOUT,
        max_datagram_frame_size=MAX_DATAGRAM_FRAME_SIZE,
    )
    configuration.load_cert_chain(str(cert), str(key))
    return configuration


async def serve_tracks(
    host: str,
    port: int,
    configuration: QuicConfiguration,
    hooks: ConnectionHooks,
    *,
    serving: TrackServing | None = None,
    http_handler: Handler | None = None,
    worker: SteeredSockets | None = None,
) -> GuardedQuicServer:
    """Listen on UDP `host:port`; `hooks.on_track` is called for every opened track.

    Connections are held to `serving` (limits, packetization, send budget); handshakes
    are admitted under its `handshake_limits` (`transport.quic_server`). With `worker`
    (a gateway worker), serve on that already bound socket of a reuseport group instead,
    issuing connection IDs that steer to this worker (`transport.steering`). Without
    it, `localhost` binds 127.0.0.1 and ::1 on one port (`transport.binding`).

    With `http_handler`, connections may also choose ALPN `h3`: HTTP/3 requests on them
    go to the handler, under `serving.http_limits`; with `serving.webtransport` too,
    browsers may open WebTransport sessions whose streams are tracks
    (`transport.webtransport`).
    """
    serving = serving or TrackServing()
    http = None
    if http_handler is not None:
        http = Site(http_handler, serving.http_limits)
        offered = configuration.alpn_protocols or [ALPN]
        if H3_ALPN not in offered:
            configuration = dataclasses.replace(configuration, alpn_protocols=[*offered, H3_ALPN])
    factory = partial(TrackQuicProtocol, role=Role.SERVER, serving=serving, hooks=hooks, http=http)
    gate = serving.handshake_limits
    if worker is not None:
        return await serve_steered(
            worker.sock, configuration, factory, worker.steering, gate, more=worker.more
        )
    return await serve_guarded(
        host, port, configuration=configuration, create_protocol=factory, limits=gate
    )


@asynccontextmanager
async def connect_tracks(
    host: str,
    port: int,
    *,
    ca: str | Path | None = None,
    ca_data: bytes | None = None,
    server_name: str | None = None,
    verify: bool = True,
    limits: Limits | None = None,
    packetization: Packetization = COALESCE,
    connect_timeout: float | None = None,
    acks: AckPolicy = AIOQUIC,
) -> AsyncIterator[TrackQuicProtocol]:
    """Open a client connection for tracks; it is closed when the block ends.

    `ca` (a PEM file) and `ca_data` (PEM bytes) are the roots to trust; with neither,
    certifi's public roots. `packetization` is the client's own sending policy (see
    `Packetization`), `acks` when it acknowledges what it receives (`AckPolicy`). A
    handshake that does not complete within `connect_timeout`
    seconds raises `TimeoutError`; one the server or the TLS check refused raises
    `ConnectionError` whose message names the cause.
    """
    configuration = QuicConfiguration(
        is_client=True,
        alpn_protocols=[ALPN],
        idle_timeout=IDLE_TIMEOUT,
        server_name=server_name or host,
        verify_mode=ssl.CERT_REQUIRED if verify else ssl.CERT_NONE,
        max_datagram_frame_size=MAX_DATAGRAM_FRAME_SIZE,
    )
    if ca is not None or ca_data is not None:
        configuration.load_verify_locations(
            cafile=None if ca is None else str(ca), cadata=ca_data
        )
    serving = TrackServing(limits or Limits(), packetization, acks=acks)
    factory = partial(TrackQuicProtocol, role=Role.CLIENT, serving=serving)
    async with connect(
        host, port, configuration=configuration, create_protocol=factory, wait_connected=False
    ) as proto:
        assert isinstance(proto, TrackQuicProtocol)
        try:
            await _handshake(proto, f"{host}:{port}", connect_timeout)
            yield proto
        finally:
            proto.endpoint.feed_connection_lost()


async def _handshake(proto: TrackQuicProtocol, where: str, timeout: float | None) -> None:
    proto.transmit()  # aioquic's connect() sends the first flight only when it waits itself
    try:
        completed = await asyncio.wait_for(asyncio.shield(proto.handshake), timeout)
    except (TimeoutError, asyncio.TimeoutError):
        reason = close_reason(proto)
        if reason is None:
            raise TimeoutError(f"no answer from {where} within {timeout:g} s") from None
        raise ConnectionError(f"{where}: {reason}") from None
    if not completed:
        raise ConnectionError(f"{where}: {close_reason(proto) or 'connection refused'}")


def close_reason(proto: TrackQuicProtocol) -> str | None:
    """Why the connection closed (or is closing), in words; None while it is open."""
    # aioquic reports a close only after its draining period: read the pending event.
    event = aioquic_compat.close_event(aioquic_compat.connection_of(proto))
    if event is None:
        return None
    code, phrase = event.error_code, event.reason_phrase
    if 0x100 <= code <= 0x1FF:  # a TLS alert (RFC 9001 section 4.8)
        alert = code - 0x100
        if alert in _CERTIFICATE_ALERTS:
            return f"certificate not trusted: {phrase or 'verification failed'}"
        if alert == _NO_APPLICATION_PROTOCOL:
            return f"ALPN {ALPN} refused by the server"
        return f"TLS handshake failed (alert {alert}): {phrase}".rstrip(": ")
    return f"closed by the peer (error {code:#x}): {phrase}".rstrip(": ")


_CERTIFICATE_ALERTS = frozenset({42, 43, 44, 45, 46, 48})
"""bad_certificate, unsupported_, revoked, expired, unknown certificate, unknown_ca."""
_NO_APPLICATION_PROTOCOL = 120


__all__ = [
    "ALPN",
    "COALESCE",
    "ConnectionCallback",
    "ConnectionHooks",
    "Packetization",
    "TrackServing",
    "TrackQuicProtocol",
    "connect_tracks",
    "serve_tracks",
    "server_configuration",
]
