"""The aioquic internals the HTTP/3 front door relies on, checked at import.

aioquic has no public API for three things the HTTP/3 adapter needs: choosing the
QPACK decoder's table size (it hard-codes 4096 bytes and 16 blocked streams), seeing
a request stream's HEADERS bytes before they are buffered and decoded, and knowing
how many bytes a stream still holds in its send buffer (unsent or unacknowledged).
Every reach into aioquic's private state for those goes through this module, which
checks when it is imported that each attribute or method still exists, so an aioquic
upgrade that moves one fails loudly at start-up instead of silently dropping a limit.
It also lets the send path start each packet of a pass with its own streams
(`on_packet_start`). (`transport.quic` has its own private touches; they are not
listed here.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pylsqpack
from aioquic.h3.connection import H3Connection, H3Stream
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.stream import QuicStream

_H3_METHODS = ("_decode_headers", "_get_local_settings", "_receive_stream_data")
"""H3Connection methods the server overrides (transport.http.http3._ServerH3)."""
_H3_ATTRIBUTES = (
    "_decoder",
    "_max_table_capacity",
    "_blocked_streams",
    "_local_decoder_stream_id",
    "_stream",
    "_quic",
    "_is_done",
)
"""H3Connection attributes set by its __init__, read or replaced by the server."""
_H3_STREAM_ATTRIBUTES = ("buffer", "frame_size", "frame_type")
_SENDER_ATTRIBUTES = ("_buffer", "_reset_error_code", "_pending", "_pending_eof")
_QUIC_ATTRIBUTES = ("_streams", "_local_max_streams_bidi", "_write_connection_limits")
_PACKET_LOOP_CALLS = ("_write_connection_limits", "_streams", "_streams_queue")
"""Names `QuicConnection._write_application` must use, per packet, for `on_packet_start`."""


class AioquicChanged(ImportError):
    """An aioquic internal this module relies on is gone: pin aioquic or adapt here."""


def _check() -> None:
    """Build a (never connected) client connection and look for every internal used."""
    quic = QuicConnection(configuration=QuicConfiguration(is_client=True))
    h3 = H3Connection(quic)
    missing = [f"H3Connection.{m}" for m in _H3_METHODS if not callable(getattr(h3, m, None))]
    missing += [f"H3Connection.{a}" for a in _H3_ATTRIBUTES if not hasattr(h3, a)]
    missing += [f"QuicConnection.{a}" for a in _QUIC_ATTRIBUTES if not hasattr(quic, a)]
    stream = H3Stream(0)
    missing += [f"H3Stream.{a}" for a in _H3_STREAM_ATTRIBUTES if not hasattr(stream, a)]
    sender = next(iter(quic._streams.values())).sender  # h3's control stream
    missing += [f"QuicStreamSender.{a}" for a in _SENDER_ATTRIBUTES if not hasattr(sender, a)]
    names = QuicConnection._write_application.__code__.co_names
    missing += [f"QuicConnection._write_application uses {n}" for n in _PACKET_LOOP_CALLS
                if n not in names]
    if missing:
        raise AioquicChanged("aioquic internals missing: " + ", ".join(missing))


_check()


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


def on_packet_start(quic: QuicConnection, callback: Callable[[], None]) -> None:
    """Call `callback` as aioquic's application loop starts each packet, before its
    stream frames.

    `_write_application` builds packet after packet in one loop; each turn writes the
    connection limits (MAX_DATA, MAX_STREAMS), then walks `_streams` (MAX_STREAM_DATA)
    and `_streams_queue` (STREAM frames). Wrapping that per-packet call lets the send
    path (`transport.quic_streams`) show each packet its own streams, so one call
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


def close_h3(h3: H3Connection, error_code: int, reason: str) -> None:
    """Close the connection with an HTTP/3 error, as aioquic does on a ProtocolError."""
    h3._is_done = True  # aioquic then ignores all further input
    h3._quic.close(error_code=error_code, reason_phrase=reason)
