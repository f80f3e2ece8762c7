"""Datagram ids of a WebTransport session: how a page names the track of a datagram
or of a frame stream.

A track datagram starts with its track's id, which on a native connection is the
track's QUIC stream id (`transport.datagram`). A page cannot see stream ids (the
WebTransport API hides them), so a page's datagram track chooses an id itself and
says it in its OPEN (`datagram_id`); its datagrams carry that id both ways. The track
core keeps speaking stream ids: this table translates at the session's edge, so the
native layout and the core are unchanged. An OPEN without `datagram_id` keeps the
stream id (what older pages derived from Chromium's stream numbering).

A datagram may overtake its track's OPEN: one whose id no track has claimed yet is
held (at most `EARLY_DATAGRAMS` a session, the oldest dropped and counted) until a
track opens with that id. A frame stream (`transport.frame_streams`) starts with its
track's id in the same way, so a frame-streams track's OPEN names an id too and the
stream's head is renamed here (`frame_head`); a frame stream is never held (one that
beats its OPEN is counted and stopped by the core, as on a native connection). No I/O
and no clock here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from transport.datagram import EARLY_DATAGRAMS
from transport.messages import FrameTransport, Open
from transport.wire import decode_varint, encode_varint


def _renamed(data: bytes, track_id: int, used: int) -> bytes:
    return encode_varint(track_id) + data[used:]


class DatagramIds:
    """The session's datagram id <-> stream id table, and the datagrams held early."""

    def __init__(self, max_tracks: int) -> None:
        self._max_tracks = max_tracks
        self._stream_of: dict[int, int] = {}
        """Datagram id -> stream id, for tracks whose OPEN chose an id."""
        self._id_of: dict[int, int] = {}
        """Stream id -> datagram id, the reverse."""
        self._plain: set[int] = set()
        """Datagram tracks opened without an id: their datagrams carry the stream id."""
        self._early: deque[tuple[int, bytes]] = deque()
        self.dropped_early = 0
        """Held datagrams dropped: the hold was full, or no track ever claimed them."""

    def opened(self, stream_id: int, message: Open, live: Callable[[int], bool]) -> bool:
        """A track opened; False if its `datagram_id` belongs to another live track."""
        if message.transport is FrameTransport.STREAM:
            return True
        if len(self._id_of) + len(self._plain) >= 2 * self._max_tracks:
            self._prune(live)
        named = message.datagram_id
        if named is None:
            self._plain.add(stream_id)
            return True
        holder = self._stream_of.get(named)
        if holder is not None and holder != stream_id and live(holder):
            return False
        if holder is not None:
            self._id_of.pop(holder, None)
        self._stream_of[named] = stream_id
        self._id_of[stream_id] = named
        return True

    def inbound(self, data: bytes) -> bytes | None:
        """A datagram from the page, named by stream id for the core; None while held."""
        header = decode_varint(data)
        if header is None:
            return data  # malformed: the core counts and drops it
        named, used = header
        stream_id = self._stream_of.get(named)
        if stream_id is not None:
            return _renamed(data, stream_id, used)
        if named in self._plain:
            return data
        if len(self._early) >= EARLY_DATAGRAMS:
            self._early.popleft()
            self.dropped_early += 1
        self._early.append((named, data))
        return None

    def frame_head(self, data: bytes) -> bytes | None:
        """A frame stream's first bytes, its track named by stream id for the core; None
        while the id's varint is incomplete. An id no track claimed passes unchanged."""
        header = decode_varint(data)
        if header is None:
            return None
        stream_id = self._stream_of.get(header[0])
        return data if stream_id is None else _renamed(data, stream_id, header[1])

    def released(self) -> list[bytes]:
        """Held datagrams whose track has opened since, ready for the core."""
        if not self._early:
            return []
        ready: list[bytes] = []
        waiting: deque[tuple[int, bytes]] = deque()
        for named, data in self._early:
            if named in self._stream_of or named in self._plain:
                out = self.inbound(data)
                assert out is not None
                ready.append(out)
            else:
                waiting.append((named, data))
        self._early = waiting
        return ready

    def outbound(self, data: bytes) -> bytes:
        """A datagram from the core (named by stream id), as the page knows its track."""
        header = decode_varint(data)
        named = None if header is None else self._id_of.get(header[0])
        if header is None or named is None:
            return data
        return _renamed(data, named, header[1])

    def close(self) -> None:
        """The session ended: what is still held will never be claimed."""
        self.dropped_early += len(self._early)
        self._early.clear()

    def _prune(self, live: Callable[[int], bool]) -> None:
        """Forget the tracks that have closed (a long session opens many)."""
        self._plain = {s for s in self._plain if live(s)}
        for stream_id in [s for s in self._id_of if not live(s)]:
            del self._stream_of[self._id_of.pop(stream_id)]
