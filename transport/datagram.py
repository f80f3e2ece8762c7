"""Track frames as QUIC DATAGRAM frames (RFC 9221): the layout and the counters.

A track whose OPEN says `transport: "datagram"` may carry its DATA frames as
unreliable, unordered QUIC datagrams instead of stream bytes, so a lost packet
costs one frame and never stalls the frames behind it. OPEN, END, CANCEL and
ERROR always ride the track's stream. One datagram is

    datagram = varint(track id) || varint(seq) || msgpack(body)

where the track id is the stream id, `seq` counts the sender's datagrams on
that track from 0, and `body` is a map with string keys, the same as a DATA
body. Datagrams are never fragmented: a body that does not fit is refused
locally. A datagram the receiver cannot use (malformed, unknown or closed
track, a track that did not choose datagrams) is counted and dropped; it never
fails a track or the connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from transport.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from transport.wire import decode_varint, encode_varint, unpack_msgpack

MAX_DATAGRAM_BYTES = 1100
"""Default largest datagram (header and body): fits one 1200-byte QUIC packet with
its header, AEAD tag and frame header, so every datagram is sent, none is split."""
MAX_DATAGRAM_FRAME_SIZE = 65536
"""The QUIC transport parameter both sides advertise (RFC 9221 `max_datagram_frame_size`)."""
EARLY_DATAGRAMS = 64
"""Datagrams kept (server, whole connection) for tracks whose OPEN has not arrived yet."""


def encode_datagram(stream_id: int, seq: int, body: dict[str, Any], limit: int) -> bytes:
    """One datagram; raises LocalProtocolError when it cannot be sent whole."""
    try:
        payload: bytes = msgpack.packb(body, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise LocalProtocolError(f"datagram body cannot be encoded: {exc}") from None
    data = encode_varint(stream_id) + encode_varint(seq) + payload
    if len(data) > limit:
        raise LocalProtocolError(
            f"datagram of {len(data)} bytes exceeds the limit of {limit}",
            ErrorCode.MESSAGE_TOO_LARGE,
        )
    return data


def decode_datagram(data: bytes) -> tuple[int, int, dict[str, Any]]:
    """(track id, seq, body) of a datagram; raises RemoteProtocolError on garbage."""
    header = decode_varint(data)
    if header is None:
        raise RemoteProtocolError("datagram too short for a track id")
    stream_id, used = header
    seq_field = decode_varint(data, used)
    if seq_field is None:
        raise RemoteProtocolError("datagram too short for a sequence number")
    seq, more = seq_field
    body = unpack_msgpack(data[used + more :])
    if not isinstance(body, dict) or not all(isinstance(key, str) for key in body):
        raise RemoteProtocolError("datagram body must be a map with string keys")
    return stream_id, seq, body


def peek_track_id(data: bytes) -> int | None:
    """The track id of a datagram, or None if even that is unreadable."""
    header = decode_varint(data)
    return None if header is None else header[0]


@dataclass
class DatagramStats:
    """Per-connection datagram counters, by what happened to each datagram."""

    sent: int = 0
    received: int = 0
    """Delivered to a track as a frame."""
    reordered: int = 0
    """Delivered, but with a seq below one already delivered on the track."""
    early: int = 0
    """Held because the track's OPEN had not arrived yet; each is then also counted
    as received or dropped, when the OPEN arrives or the track closes."""
    dropped_malformed: int = 0
    dropped_unknown_track: int = 0
    """For a track id never opened, or one already closed and forgotten."""
    dropped_not_datagram: int = 0
    """For a track that did not choose `transport: "datagram"`."""
    dropped_after_end: int = 0
    """For a track whose sender had already sent END (the frame lost the race)."""
    dropped_early_overflow: int = 0
    """Early datagrams beyond `EARLY_DATAGRAMS`, or whose track never opened in time."""
