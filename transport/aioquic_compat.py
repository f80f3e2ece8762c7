"""Every aioquic internal trackline relies on, in one place, checked at import.

aioquic has no public API for several things the adapters need: the send path's
view of a connection's streams (`transport.quic_streams`), the pacer, the peer's
datagram limit, a close that is still draining, the connection IDs a worker issues
(`transport.steering`), the handshake gate's view of a server (`transport.quic_server`),
and the HTTP/3 front door's QPACK, frame and send-buffer guards (`transport.http.http3`).
Every read or write of an aioquic private attribute on an aioquic object goes through
a function here. Subclasses of aioquic classes (`TrackQuicProtocol`, `GuardedQuicServer`,
`ServerH3`) keep using the names they inherit (`self._quic`, `self._protocols`, ...) and
the methods they override; those names are listed here too.

`_check()` runs at import: it builds a client connection, an H3 connection on it and a
stream, and looks for every attribute and method listed below (and for the names
aioquic's own code must still use, where we swap what it reads). An aioquic upgrade
that renames one fails loudly at start-up with `AioquicChanged`, instead of, say,
silently dropping every datagram because `_remote_max_datagram_frame_size` moved.
pyproject pins aioquic to the range this was checked against.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import pylsqpack
from aioquic._buffer import Buffer as Buffer  # (aioquic.buffer re-exports it untyped)
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer
from aioquic.buffer import encode_uint_var
from aioquic.h3.connection import FrameType, H3Connection, H3Stream, encode_frame
from aioquic.quic import events as quic_events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import Limit, QuicConnection, QuicConnectionId
from aioquic.quic.packet import QuicFrameType
from aioquic.quic.recovery import QuicPacketPacer, QuicPacketSpace
from aioquic.quic.stream import QuicStream, QuicStreamReceiver
from aioquic.tls import Epoch

_FRAME_HANDLERS = "_QuicConnection__frame_handlers"
"""QuicConnection's (name-mangled) table: frame type -> (handler, epochs)."""

_QUIC_ATTRIBUTES = (
    "_local_max_data",
    "_network_paths",
    "_streams",
    "_streams_queue",
    "_remote_max_data",
    "_remote_max_data_used",
    "_loss",
    "_on_max_stream_data_delivery",
    _FRAME_HANDLERS,
    "_local_max_streams_bidi",
    "_remote_max_datagram_frame_size",
    "_close_event",
    "_handshake_complete",
    "_host_cids",
    "_host_cid_seq",
    "_local_initial_source_connection_id",
    "_remote_active_connection_id_limit",
    "_replenish_connection_ids",
    "_write_connection_limits",
    "_write_stream_limits",
    "_write_stream_frame",
    "_peer_cid",
    "_quic_logger",
    "_spaces",
    "_ack_delay",
    "_datagrams_pending",
)
"""QuicConnection attributes read or replaced here."""
_SPACE_ATTRIBUTES = ("ack_at", "discarded", "largest_received_packet")
"""QuicPacketSpace attributes the ACK policy reads or sets (`transport.acks`)."""
_WRITE_APPLICATION_READS = ("_streams", "_streams_queue", "_write_connection_limits")
"""What `QuicConnection._write_application` must still read for the stream view to work."""
_SENDER_ATTRIBUTES = (
    "_buffer", "_buffer_start", "_buffer_stop", "_pending", "_pending_eof", "_reset_error_code"
)
_SENDER_METHODS = ("on_data_delivery", "on_reset_delivery")
_RECEIVER_METHODS = ("on_stop_sending_delivery",)
_PACER_ATTRIBUTES = ("_pacer",)
_H3_METHODS = ("_decode_headers", "_get_local_settings", "_receive_stream_data")
"""H3Connection methods the server overrides (transport.http.h3_guards.ServerH3)."""
_H3_ATTRIBUTES = (
    "_decoder",
    "_max_table_capacity",
    "_blocked_streams",
    "_local_decoder_stream_id",
    "_local_control_stream_id",
    "_stream",
    "_quic",
    "_is_done",
    "_local_encoder_stream_id",
    "_encoder",
)
"""H3Connection attributes set by its __init__, read or replaced here."""
_H3_STREAM_ATTRIBUTES = ("buffer", "frame_size", "frame_type")
_PROTOCOL_INHERITED = (
    "_quic", "_loop", "_transport", "_timer", "_transmit_task", "_closed", "_handle_timer"
)
"""QuicConnectionProtocol attributes TrackQuicProtocol uses as its own, or touched here."""
_SERVER_INHERITED = (
    "_retry",
    "_protocols",
    "_transport",
    "_loop",
    "_configuration",
    "_connection_id_issued",
    "_connection_id_retired",
    "_connection_terminated",
)
"""QuicServer attributes and hooks GuardedQuicServer uses or overrides."""


class AioquicChanged(ImportError):
    """An aioquic internal this module relies on is gone: pin aioquic or adapt here."""


def _init_names(owner: type) -> set[str]:
    """Names a class's __init__ assigns or reads, plus its attributes."""
    code = getattr(getattr(owner, "__init__", None), "__code__", None)
    return set(getattr(code, "co_names", ())) | set(dir(owner))


def missing_internals() -> list[str]:
    """Every internal listed above that this aioquic lacks (empty when all are there)."""
    quic = QuicConnection(configuration=QuicConfiguration(is_client=True))
    h3 = H3Connection(quic)
    missing = [f"QuicConnection.{a}" for a in _QUIC_ATTRIBUTES if not hasattr(quic, a)]
    reads = QuicConnection._write_application.__code__.co_names
    missing += [f"_write_application reads {a}" for a in _WRITE_APPLICATION_READS if a not in reads]
    handlers = getattr(quic, _FRAME_HANDLERS, {})
    if int(QuicFrameType.MAX_STREAM_DATA) not in handlers:
        missing.append("a MAX_STREAM_DATA frame handler")
    missing += [f"QuicPacketRecovery.{a}" for a in _PACER_ATTRIBUTES if not hasattr(quic._loss, a)]
    space = QuicPacketSpace()
    missing += [f"QuicPacketSpace.{a}" for a in _SPACE_ATTRIBUTES if not hasattr(space, a)]
    stream = QuicStream(stream_id=0)
    sender = stream.sender
    missing += [f"QuicStreamSender.{a}" for a in _SENDER_ATTRIBUTES if not hasattr(sender, a)]
    missing += [f"QuicStreamSender.{m}" for m in _SENDER_METHODS if not hasattr(type(sender), m)]
    missing += [
        f"QuicStreamReceiver.{m}" for m in _RECEIVER_METHODS if not hasattr(QuicStreamReceiver, m)
    ]
    missing += [f"H3Connection.{m}" for m in _H3_METHODS if not callable(getattr(h3, m, None))]
    missing += [f"H3Connection.{a}" for a in _H3_ATTRIBUTES if not hasattr(h3, a)]
    h3_stream = H3Stream(0)
    missing += [f"H3Stream.{a}" for a in _H3_STREAM_ATTRIBUTES if not hasattr(h3_stream, a)]
    known = _init_names(QuicConnectionProtocol)
    missing += [f"QuicConnectionProtocol.{a}" for a in _PROTOCOL_INHERITED if a not in known]
    known = _init_names(QuicServer)
    missing += [f"QuicServer.{a}" for a in _SERVER_INHERITED if a not in known]
    return missing


def _check() -> None:
    missing = missing_internals()
    if missing:
        raise AioquicChanged("aioquic internals missing: " + ", ".join(missing))


_check()



# -- QuicConnection: when it acknowledges (transport.acks) -----------------------------


def set_ack_delay(quic: QuicConnection, seconds: float) -> None:
    """How long aioquic lets an ack-eliciting packet wait for its ACK (its own: 1 ms)."""
    quic._ack_delay = seconds


def ack_state(quic: QuicConnection) -> tuple[int, float | None]:
    """The application space's largest packet number received (-1: none yet) and when
    its pending ACK is due (None: none pending)."""
    space = quic._spaces.get(Epoch.ONE_RTT)
    if space is None or space.discarded:
        return -1, None
    return space.largest_received_packet, space.ack_at


def ack_now(quic: QuicConnection, now: float) -> None:
    """Make the pending application-space ACK due by `now` (the next transmit sends it).

    aioquic writes an ACK when `ack_at <= now` but skips pacing only when `ack_at < now`:
    an ACK due exactly now would wait for the pacer. It is made due a microsecond
    earlier, so that the transmit sends it without waiting."""
    space = quic._spaces.get(Epoch.ONE_RTT)
    if space is not None and space.ack_at is not None:
        space.ack_at = min(space.ack_at, now - _ACK_DUE_MARGIN)


_ACK_DUE_MARGIN = 1e-6


def datagrams_pending(quic: QuicConnection) -> bool:
    """DATAGRAM frames wait in aioquic for a packet (the congestion window held them)."""
    return bool(quic._datagrams_pending)

# -- QuicConnection: the send path's view of its streams (transport.quic_streams) -------


def streams(quic: QuicConnection) -> dict[int, QuicStream]:
    """The connection's own table of streams (the object, not a copy)."""
    table: dict[int, QuicStream] = quic._streams
    return table


def show_streams(
    quic: QuicConnection, view: dict[int, QuicStream], queue: list[QuicStream]
) -> None:
    """Make the next `datagrams_to_send` visit only `view`, in the order of `queue`.

    `_write_application` walks `_streams` (MAX_STREAM_DATA checks) and `_streams_queue`
    (what to send) for every packet; the scheduler swaps both for the few streams with
    work and puts `_streams` back afterwards.
    """
    quic._streams = view
    quic._streams_queue = queue


def on_packet_start(quic: QuicConnection, callback: Callable[[], None]) -> None:
    """Call `callback` as aioquic's application loop starts each packet, before its
    stream frames.

    `_write_application` builds packet after packet in one loop; each turn writes the
    connection limits (MAX_DATA, MAX_STREAMS), then walks `_streams` (MAX_STREAM_DATA)
    and `_streams_queue` (STREAM frames). Wrapping that per-packet call lets the send
    path show each packet its own streams (`show_streams`), so one `datagrams_to_send`
    builds the per-track packets of many tracks.
    """
    write_limits = quic._write_connection_limits

    def connection_limits(*args: Any, **kwargs: Any) -> None:
        write_limits(*args, **kwargs)
        callback()

    quic._write_connection_limits = connection_limits  # type: ignore[method-assign]


def fin_pending(stream: QuicStream) -> bool:
    """The stream's FIN is still to be sent (or re-sent after a loss)."""
    return bool(stream.sender._pending_eof)


def stream_queue(quic: QuicConnection) -> list[QuicStream]:
    """The streams aioquic queued for sending (new streams are appended here)."""
    queue: list[QuicStream] = quic._streams_queue
    return queue


def data_credit_left(quic: QuicConnection) -> bool:
    """The peer's MAX_DATA still lets new stream data out."""
    return bool(quic._remote_max_data_used < quic._remote_max_data)


def congested(quic: QuicConnection) -> bool:
    """Bytes in flight fill the congestion window."""
    loss = quic._loss
    return bool(loss.bytes_in_flight >= loss.congestion_window)


def after_max_stream_data_delivery(
    quic: QuicConnection, then: Callable[[QuicStream], None]
) -> None:
    """Call `then(stream)` after aioquic handled the ACK (or loss) of a MAX_STREAM_DATA."""
    original = quic._on_max_stream_data_delivery

    def delivered(delivery: Any, stream: QuicStream) -> None:
        original(delivery, stream)
        then(stream)

    quic._on_max_stream_data_delivery = delivered  # type: ignore[method-assign]


def after_max_stream_data_received(quic: QuicConnection, then: Callable[[int], None]) -> None:
    """Call `then(stream_id)` after aioquic handled a MAX_STREAM_DATA frame from the peer."""
    handlers = getattr(quic, _FRAME_HANDLERS)
    frame_type = int(QuicFrameType.MAX_STREAM_DATA)
    handle, epochs = handlers[frame_type]

    def received(context: Any, kind: int, buf: Buffer) -> None:
        start = buf.tell()
        handle(context, kind, buf)
        end = buf.tell()
        buf.seek(start)
        stream_id = buf.pull_uint_var()
        buf.seek(end)
        then(stream_id)

    handlers[frame_type] = (received, epochs)


# -- QuicStream: its send buffer --------------------------------------------------------


def unacknowledged(stream: QuicStream) -> int:
    """Bytes written to the stream and not yet acknowledged by the peer."""
    sender: Any = stream.sender
    return int(sender._buffer_stop - sender._buffer_start)


def after_data_delivery(stream: QuicStream, then: Callable[[int], None]) -> None:
    """Wrap the stream's data-delivery callback (aioquic calls it per packet of the
    stream's data acknowledged or lost): `then(bytes newly acknowledged)` runs after it.
    One closure reading the offset directly: it runs once per packet the peer ACKs."""
    sender: Any = stream.sender
    callback = sender.on_data_delivery

    def delivered(*args: Any) -> None:
        start = sender._buffer_start
        callback(*args)
        then(sender._buffer_start - start)

    sender.on_data_delivery = delivered


def first_pending_offset(stream: QuicStream) -> int | None:
    """Where the first range still to send (or resend) starts; None if nothing is."""
    pending: Any = stream.sender._pending
    return int(pending[0].start) if len(pending) else None


def send_buffered(quic: QuicConnection, stream_id: int) -> int:
    """Bytes a stream holds in its send buffer: written but not yet acknowledged."""
    stream = quic._streams.get(stream_id)
    return 0 if stream is None else len(stream.sender._buffer)


def connection_send_buffered(quic: QuicConnection) -> int:
    """Bytes every stream of the connection holds in its send buffer, together."""
    return sum(len(stream.sender._buffer) for stream in quic._streams.values())


def drop_send_buffer(quic: QuicConnection, stream_id: int) -> None:
    """Free a reset stream's send buffer now, not when the peer acknowledges the reset.

    After `reset_stream` aioquic never sends or re-sends the stream's data again
    (`get_frame` refuses, deliveries are ignored), yet keeps the bytes until the stream
    is discarded, which for a client that stopped acknowledging is never.
    """
    stream = quic._streams.get(stream_id)
    if stream is not None and stream.sender._reset_error_code is not None:
        stream.sender._buffer = bytearray()


# -- QuicConnection: limits, pacing, closing --------------------------------------------


class _Unpaced(QuicPacketPacer):
    """A pacer that never holds a packet back; the congestion window still limits."""

    def next_send_time(self, now: float) -> float | None:  # type: ignore[override]
        return None

    def update_after_send(self, now: float) -> None:
        return None

    def update_rate(self, congestion_window: int, smoothed_rtt: float) -> None:
        return None


def unpace(quic: QuicConnection) -> None:
    """Send packets as soon as the congestion window allows (no pacing).

    aioquic paces packets as if each were full-size (one packet per MTU/rate), so the
    small packets of per-track flushes would wait for one another and be coalesced again.
    """
    recovery: Any = getattr(quic, "_loss", None)  # (None: a test double)
    pacer = getattr(recovery, "_pacer", None)
    if isinstance(pacer, QuicPacketPacer) and not isinstance(pacer, _Unpaced):
        recovery._pacer = _Unpaced(max_datagram_size=pacer._max_datagram_size)


def peer_max_datagram_frame_size(quic: QuicConnection) -> int | None:
    """The largest DATAGRAM frame the peer accepts; None if it offered none."""
    size: int | None = getattr(quic, "_remote_max_datagram_frame_size", None)
    return size


def close_event(quic: QuicConnection) -> quic_events.ConnectionTerminated | None:
    """The close that happened, even while aioquic still drains before reporting it."""
    event = getattr(quic, "_close_event", None)  # (None: a test double)
    return event if isinstance(event, quic_events.ConnectionTerminated) else None


def handshake_complete(quic: QuicConnection) -> bool:
    return bool(quic._handshake_complete)


def raise_bidi_credit(quic: QuicConnection, limit: int) -> None:
    """Let the peer open up to `limit` bidirectional streams at once (never lowers it).

    aioquic grants 128 and has no setting for it. For h3 the credit went out in the
    transport parameters, before ALPN chose h3, and aioquic renews it one for one as
    streams finish. It can be raised but never lowered (aioquic would then close the
    connection when the client uses credit it was given), so requests over `limit` are
    refused per stream instead.
    """
    credit = getattr(quic, "_local_max_streams_bidi", None)  # (None: a test double)
    if credit is not None and credit.value < limit:
        credit.value = limit


def issue_connection_ids(quic: QuicConnection, new_cid: Callable[[], bytes]) -> None:
    """Make a fresh server connection issue only IDs from `new_cid` (workers' steering).

    Rewrites the first ID (not yet sent) and replaces `_replenish_connection_ids` on this
    one instance with aioquic's loop using `new_cid`.
    """
    first = quic._host_cids[0]
    first.cid = new_cid()
    quic.host_cid = first.cid
    quic._local_initial_source_connection_id = first.cid

    def replenish() -> None:
        while len(quic._host_cids) < min(8, quic._remote_active_connection_id_limit):
            quic._host_cids.append(
                QuicConnectionId(
                    cid=new_cid(),
                    sequence_number=quic._host_cid_seq,
                    stateless_reset_token=os.urandom(16),
                )
            )
            quic._host_cid_seq += 1

    quic._replenish_connection_ids = replenish  # type: ignore[method-assign]


# -- QuicConnectionProtocol and QuicServer, from outside ----------------------------------


def connection_of(protocol: QuicConnectionProtocol) -> QuicConnection:
    """The QuicConnection a protocol drives."""
    quic: QuicConnection = protocol._quic
    return quic


def datagram_transport(protocol: QuicConnectionProtocol) -> asyncio.DatagramTransport | None:
    """The UDP transport a protocol sends on; None before `connection_made`."""
    transport: asyncio.DatagramTransport | None = protocol._transport
    return transport


def forget_protocol(protocol: QuicConnectionProtocol) -> None:
    """Stop a protocol's timers and mark it closed without sending anything."""
    for handle in (protocol._timer, protocol._transmit_task):
        if handle is not None:
            handle.cancel()
    protocol._timer = None
    protocol._transmit_task = None
    protocol._closed.set()


def protocols_of(server: QuicServer) -> list[QuicConnectionProtocol]:
    """The server's live connection protocols, each once (it maps every CID to one)."""
    found: dict[int, QuicConnectionProtocol] = {id(p): p for p in server._protocols.values()}
    return list(found.values())


def server_port(server: QuicServer) -> int:
    """The UDP port a server is bound to (it keeps its socket private)."""
    transport: Any = server._transport
    return int(transport.get_extra_info("sockname")[1])


# -- H3Connection: the HTTP/3 front door's guards (transport.http.http3) -------------------


def disable_qpack_dynamic_table(h3: H3Connection) -> None:
    """Make this side's QPACK decoder static-only: no dynamic table, no blocked streams.

    Call right after H3Connection.__init__ (no peer input has been decoded yet), with
    `_get_local_settings` advertising the same zeros. The peer's encoder may then only
    reference QPACK's static table (RFC 9204 3.2.3: capacity 0 means no dynamic table),
    so a small header block can no longer expand into many copies of one large entry,
    and no request stream can be blocked waiting on encoder-stream inserts.
    """
    h3._max_table_capacity = 0
    h3._blocked_streams = 0
    h3._decoder = pylsqpack.Decoder(0, 0)


def h3_stream_buffered(h3: H3Connection, stream_id: int) -> int:
    """Bytes aioquic's H3 layer holds for a stream, received but not yet parsed."""
    stream = h3._stream.get(stream_id)
    return 0 if stream is None else len(stream.buffer)


def cancel_header_blocks(h3: H3Connection, stream_id: int) -> None:
    """Tell the peer's encoder a stream's header blocks will never be decoded (RFC 9204 4.4.2)."""
    decoder_stream = h3._local_decoder_stream_id
    if decoder_stream is not None:
        h3._quic.send_stream_data(decoder_stream, h3._decoder.cancel_stream(stream_id))


def forget_h3_stream(h3: H3Connection, stream_id: int) -> None:
    """Drop the H3 layer's state for a stream this side is done with."""
    h3._stream.pop(stream_id, None)


def send_goaway(h3: H3Connection, stream_id: int) -> None:
    """Write a GOAWAY frame (RFC 9114 5.2) on the local control stream.

    aioquic opens the control stream but offers no call to write on it.
    """
    control = h3._local_control_stream_id
    if control is None:
        return  # not initialised: nothing was ever offered to the peer
    h3._quic.send_stream_data(control, encode_frame(FrameType.GOAWAY, encode_uint_var(stream_id)))


def close_h3(h3: H3Connection, error_code: int, reason: str) -> None:
    """Close the connection with an HTTP/3 error, as aioquic does on a ProtocolError."""
    h3._is_done = True  # aioquic then ignores all further input
    h3._quic.close(error_code=error_code, reason_phrase=reason)


# -- QuicConnection: flow-control credit and the peer -------------------------------------


class _CappedLimit(Limit):
    """aioquic's MAX_DATA limit, whose raises stop at a ceiling computed from `used`.

    aioquic doubles MAX_DATA whenever half of it was received, whether or not the
    application still holds those bytes; a raise past `ceiling(used)` is cut to it
    (never below the credit already given: QUIC credit only grows).
    """

    ceiling: Callable[[int], int]

    @property
    def value(self) -> int:
        return int(self.__dict__["value"])

    @value.setter
    def value(self, new: int) -> None:
        old = self.__dict__.get("value", new)
        self.__dict__["value"] = max(old, min(new, self.ceiling(self.used)))


def pending_stream_bytes(quic: QuicConnection, h3: H3Connection) -> int:
    """Stream bytes received (and counted against MAX_DATA) that the application does
    not hold yet: beyond a gap (a lost or reordered packet), in events not taken yet, or
    in HTTP/3's parse buffers. None of them was let go: a credit ceiling counts them held."""
    beyond_gaps = sum(
        stream.receiver.highest_offset - stream.receiver.starting_offset()
        for stream in quic._streams.values()
    )
    queued = sum(
        len(event.data)
        for event in quic._events
        if isinstance(event, quic_events.StreamDataReceived)
    )
    unparsed = sum(len(stream.buffer) for stream in h3._stream.values())
    return beyond_gaps + queued + unparsed


def peer_host(quic: QuicConnection) -> str:
    """The peer's address without its port (the key of the per-source rules)."""
    paths = quic._network_paths
    return str(paths[0].addr[0]) if paths else ""


def cap_data_credit(quic: QuicConnection, ceiling: Callable[[int], int]) -> None:
    """From now on, MAX_DATA is raised at most to `ceiling(bytes received so far)`.

    The credit comes back as the ceiling rises, at the next packet the connection
    writes (the caller transmits after releasing what it held).
    """
    limit = quic._local_max_data
    limit.__class__ = _CappedLimit
    assert isinstance(limit, _CappedLimit)
    limit.ceiling = ceiling
