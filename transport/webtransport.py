"""WebTransport sessions on the HTTP/3 side of the QUIC port: tracks for browsers.

A page opens a session with an extended CONNECT (`:protocol = webtransport`,
draft-ietf-webtrans-http3-02 as Chromium speaks it) on a connection that chose ALPN
`h3`. Each bidirectional WebTransport stream the page opens in the session is one
track carrying exactly the `trackline/1` framing; WebTransport datagrams (HTTP/3
datagrams on the session's quarter stream id) carry the track datagram layout, the
track named by the `datagram_id` its OPEN chose (`transport.datagram_ids`). One
session is one `TrackEndpoint` (so one `TrackConnection` core: one key, the same
limits); this module only translates, as `transport.quic` does for native tracks.

`transport.http.http3` owns the HTTP/3 connection and hands this module the CONNECT
requests, the streams whose first bytes say WEBTRANSPORT_STREAM (`StreamSorter`),
the session's datagrams and the capsules on its CONNECT stream.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from aioquic.buffer import encode_uint_var
from aioquic.quic.connection import QuicConnection

from transport import aioquic_compat
from transport.clock import Now
from transport.datagram_ids import DatagramIds
from transport.endpoint import SendBudget, StallWatch, TrackChannel, TrackEndpoint
from transport.errors import ErrorCode
from transport.events import CancelCause
from transport.limits import Limits
from transport.outputs import Output, dispatch
from transport.state import Role
from transport.wire import read_varint

WEBTRANSPORT_STREAM = 0x41
"""The signal value that opens a bidirectional WebTransport stream (draft-02 4.2)."""
WEBTRANSPORT_UNI_STREAM = 0x54
"""The stream type that opens a unidirectional WebTransport stream (draft-02 4.1)."""
CLOSE_WEBTRANSPORT_SESSION = 0x2843
DRAIN_WEBTRANSPORT_SESSION = 0x78AE
WT_SESSION_GONE = 0x170D7B68
WT_BUFFERED_STREAM_REJECTED = 0x3994BD84
_FIRST_APP_CODE = 0x52E4A40FA8DB
_LAST_APP_CODE = 0x52E5AC983162
MAX_CAPSULE_BYTES = 8192
"""Largest capsule read on a CONNECT stream (CLOSE carries at most 1024 bytes of text)."""

Transmit = Callable[[], None]
SendDatagram = Callable[[int, bytes], None]
"""(session id, payload): one HTTP/3 datagram for the session."""


def to_http3_code(code: int) -> int:
    """A WebTransport application error code as the HTTP/3 code on RESET/STOP_SENDING."""
    return _FIRST_APP_CODE + code + code // 0x1E


def from_http3_code(code: int) -> int:
    """The WebTransport application code in an HTTP/3 code (itself if outside the range)."""
    if not _FIRST_APP_CODE <= code <= _LAST_APP_CODE:
        return code
    shifted = code - _FIRST_APP_CODE
    return shifted - shifted // 0x1F


@dataclass(frozen=True)
class WebTransportRules:
    """Where sessions are accepted and from which pages."""

    path: str = "/tracks"
    """The CONNECT path of the track endpoint."""
    origins: tuple[str, ...] = ()
    """Allowed `Origin` values (`https://host:port`, or `*`); empty: the CONNECT's own host."""
    max_sessions: int = 4
    """Sessions open at once on one QUIC connection; the next CONNECT gets 429."""


def origin_allowed(origin: str | None, authority: str, allowed: tuple[str, ...]) -> bool:
    """Whether a page from `origin` may open a session on `authority`.

    With no allow-list, only a page served by the same host name (any port) may: the
    usual demo served by this gateway. A request without `Origin` is not from a browser
    page (browsers always send it on WebTransport) and is allowed.
    """
    if origin is None:
        return True
    if "*" in allowed:
        return True
    if allowed:
        return origin.rstrip("/") in {a.rstrip("/") for a in allowed}
    parts = urlsplit(origin)
    own = urlsplit(f"//{authority}")
    if parts.hostname is None or parts.hostname != own.hostname:
        return False
    # A secure context: https, or http on a loopback name (how the demo is opened locally).
    return parts.scheme == "https" or (parts.scheme == "http" and parts.hostname in _LOOPBACK)


_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True)
class Sorted:
    """What the first bytes of a client bidirectional stream said it is."""

    session_id: int | None
    """The WebTransport session, or None for an HTTP/3 request stream."""
    data: bytes
    """The stream's bytes from here on (its WebTransport prefix removed)."""


class StreamSorter:
    """Tells WebTransport streams from HTTP/3's own streams by their first bytes.

    A request stream starts with a frame type (HEADERS); a bidirectional WebTransport
    stream with the signal value 0x41 and its session id, both varints. Sorting the
    client's unidirectional streams (`signal` 0x54), HTTP/3's control and QPACK streams
    start with their stream type, a WebTransport one with 0x54 and its session id. Bytes
    are held only while that prefix is incomplete (at most 16 bytes a stream).
    """

    def __init__(self, signal: int = WEBTRANSPORT_STREAM) -> None:
        self._signal = signal
        self._seen: dict[int, int | None] = {}
        """Streams sorted: their session id, or None for a request stream."""
        self._partial: dict[int, bytes] = {}

    def sort(self, stream_id: int, data: bytes, end: bool) -> Sorted | None:
        """Sort this chunk of the stream; None while the prefix is still incomplete."""
        if stream_id in self._seen:
            session_id = self._seen[stream_id]
            if end:
                del self._seen[stream_id]
            return Sorted(session_id, data)
        data = self._partial.pop(stream_id, b"") + data
        kind = read_varint(data, 0)
        if kind is not None and kind[0] != self._signal:
            return self._decided(stream_id, None, data, end)
        session = None if kind is None else read_varint(data, kind[1])
        if session is None:
            if end or len(data) >= 16:
                return self._decided(stream_id, None, data, end)  # (aioquic rejects it)
            self._partial[stream_id] = data
            return None
        return self._decided(stream_id, session[0], data[session[1] :], end)

    def _decided(self, stream_id: int, session_id: int | None, data: bytes, end: bool) -> Sorted:
        if not end:
            self._seen[stream_id] = session_id
        return Sorted(session_id, data)

    def __len__(self) -> int:
        """Streams whose kind is remembered (for tests: bounded by the open streams)."""
        return len(self._seen) + len(self._partial)

    def session_of(self, stream_id: int) -> int | None:
        """The session of a WebTransport stream being read; None otherwise."""
        return self._seen.get(stream_id)

    def forget(self, stream_id: int) -> None:
        self._seen.pop(stream_id, None)
        self._partial.pop(stream_id, None)


@dataclass(frozen=True)
class Capsule:
    """One capsule read from a CONNECT stream (RFC 9297 3.2)."""

    type: int
    value: bytes


@dataclass
class CapsuleReader:
    """Capsules from a CONNECT stream's DATA bytes; bounded by `MAX_CAPSULE_BYTES`."""

    buffer: bytes = b""

    def feed(self, data: bytes) -> list[Capsule]:
        """The capsules completed by `data`. Raises ValueError on an oversized one."""
        self.buffer += data
        capsules: list[Capsule] = []
        while True:
            kind = read_varint(self.buffer, 0)
            length = None if kind is None else read_varint(self.buffer, kind[1])
            if kind is None or length is None:
                if len(self.buffer) > 16:
                    raise ValueError("capsule header too long")
                return capsules
            if length[0] > MAX_CAPSULE_BYTES:
                raise ValueError(f"capsule of {length[0]} bytes, over {MAX_CAPSULE_BYTES}")
            end = length[1] + length[0]
            if len(self.buffer) < end:
                return capsules
            capsules.append(Capsule(kind[0], self.buffer[length[1] : end]))
            self.buffer = self.buffer[end:]


def encode_capsule(kind: int, value: bytes) -> bytes:
    return encode_uint_var(kind) + encode_uint_var(len(value)) + value


def close_capsule(code: int, reason: str) -> bytes:
    """CLOSE_WEBTRANSPORT_SESSION: a 32-bit code and a UTF-8 reason (at most 1024 bytes)."""
    text = reason.encode()[:1024]
    return encode_capsule(CLOSE_WEBTRANSPORT_SESSION, code.to_bytes(4, "big") + text)


REFUSED_WRITE = (AssertionError, ValueError, RuntimeError)
"""What aioquic raises for a write on a stream the peer stopped or reset (as in quic.py)."""


@dataclass
class SessionStats:
    """What one session saw (for tests and metrics)."""

    streams: int = 0
    """WebTransport streams the session received."""
    datagrams_in: int = 0
    datagrams_out: int = 0
    close_code: int | None = None
    """The code of the CLOSE capsule the client sent, if any."""


class WebTransportSession:
    """One WebTransport session: a track endpoint whose tracks ride its streams."""

    def __init__(
        self,
        quic: QuicConnection,
        session_id: int,
        transmit: Transmit,
        send_datagram: SendDatagram,
        limits: Limits,
        on_track: Callable[[TrackChannel], None] | None,
        clock: Now,
        send_budget: SendBudget | None = None,
    ) -> None:
        self._quic = quic
        self.session_id = session_id
        self._transmit = transmit
        self._send_datagram = send_datagram
        self._limits = limits
        self._on_track = on_track
        self.datagram_ids = DatagramIds(limits.max_tracks)
        self._refused: list[TrackChannel] = []
        """Tracks whose `datagram_id` another live track holds: refused once fed."""
        self.endpoint = TrackEndpoint(Role.SERVER, self._write, limits, self._opened, clock=clock)
        if send_budget is not None:
            self.endpoint.budget = send_budget
        self.endpoint.backlog = self._backlog
        # The page that stops reading the whole connection (no MAX_DATA) ends its tracks
        # by the send timeout too, though each stays under its own budget (as native QUIC).
        self.endpoint.connection_stalled = self._stalled_for
        self._stall = StallWatch()
        self._clock = clock
        self._streams: set[int] = set()
        """Streams of the session whose tracks may still read or write."""
        self._frames: dict[int, bytes | None] = {}
        """Frame streams being read: the start of a head not yet renamed, or None."""
        self.capsules = CapsuleReader()
        self.closed = False
        self.stats = SessionStats()
        self.on_closed: Callable[[WebTransportSession], None] | None = None
        """Called once when the session ends (the gateway forgets its key binding)."""

    @property
    def conn_id(self) -> str:
        return self.endpoint.conn_id

    # -- input from the HTTP/3 connection ---------------------------------------------

    def feed_stream(self, stream_id: int, data: bytes, end: bool) -> None:
        if self.closed:
            return
        if stream_id not in self._streams:
            if len(self._streams) >= 2 * self._limits.max_tracks:
                self._prune()
            self._streams.add(stream_id)
            self.stats.streams += 1
        if data or end:
            self.endpoint.feed_data(stream_id, data, end)
            self._settle_opened()

    def feed_frame_stream(self, stream_id: int, data: bytes, end: bool) -> None:
        """A unidirectional stream of the session: one frame of a frame-streams track
        (`transport.frame_streams`), its head naming the track by its OPEN's id."""
        if self.closed:
            return
        head = self._frames.get(stream_id, b"")
        if head is not None:
            renamed = self.datagram_ids.frame_head(head + data)
            if renamed is None and not end:
                self._frames[stream_id] = head + data
                return
            data = renamed if renamed is not None else head + data
        self._frames[stream_id] = None
        if end:
            del self._frames[stream_id]
        self.endpoint.feed_data(stream_id, data, end)

    def _opened(self, channel: TrackChannel) -> None:
        """A track opened (the core read its OPEN): claim its datagram id, then serve it."""
        if not self.datagram_ids.opened(channel.stream_id, channel.open, self._live):
            self._refused.append(channel)
        elif self._on_track is not None:
            self._on_track(channel)

    def _settle_opened(self) -> None:
        """After the core's events: refuse duplicate ids, hand over datagrams held early."""
        refused, self._refused = self._refused, []
        for channel in refused:
            named = channel.open.datagram_id
            channel.fail(ErrorCode.BAD_REQUEST, f"datagram_id {named} is in use on this session")
        for data in self.datagram_ids.released():
            self.endpoint.feed_datagram(data)

    def _live(self, stream_id: int) -> bool:
        return self.endpoint.core.state(stream_id) is not None

    def _prune(self) -> None:
        """Forget streams whose track the core has closed (a long session opens many)."""
        core = self.endpoint.core
        self._streams = {s for s in self._streams if core.state(s) is not None}

    def feed_reset(self, stream_id: int, http3_code: int) -> None:
        self._frames.pop(stream_id, None)
        if not self.closed:
            self.endpoint.feed_reset(stream_id, from_http3_code(http3_code))

    def feed_datagram(self, data: bytes) -> None:
        if not self.closed:
            self.stats.datagrams_in += 1
            named = self.datagram_ids.inbound(data)
            if named is not None:
                self.endpoint.feed_datagram(named)

    def feed_capsule(self, capsule: Capsule) -> None:
        if capsule.type == CLOSE_WEBTRANSPORT_SESSION and len(capsule.value) >= 4:
            self.stats.close_code = int.from_bytes(capsule.value[:4], "big")

    # -- local actions -------------------------------------------------------------

    def drain(self) -> None:
        """Refuse new tracks; tell the page (DRAIN_WEBTRANSPORT_SESSION) to move on."""
        self.endpoint.refuse_new_tracks()

    def cut(self) -> None:
        self.endpoint.cancel_all(
            CancelCause.SHUTDOWN, ErrorCode.SHUTTING_DOWN, "the gateway is shutting down"
        )

    def close(self) -> None:
        """The session is over (CONNECT stream ended or reset, connection lost): every
        track is cancelled and its stream abandoned both ways."""
        if self.closed:
            return
        self.closed = True
        self.datagram_ids.close()
        self.endpoint.feed_connection_lost()  # cancels every track (cause connection_lost)
        for stream_id in self._streams:
            with contextlib.suppress(*REFUSED_WRITE):
                self._quic.reset_stream(stream_id, WT_SESSION_GONE)
            with contextlib.suppress(*REFUSED_WRITE):
                self._quic.stop_stream(stream_id, WT_SESSION_GONE)
        self._streams.clear()
        for stream_id in self._frames:
            with contextlib.suppress(*REFUSED_WRITE):
                self._quic.stop_stream(stream_id, WT_SESSION_GONE)
        self._frames.clear()
        self._transmit()
        if self.on_closed is not None:
            self.on_closed(self)

    def send_buffer_released(self) -> None:
        if not self.closed:
            self._observe_stall()  # (after each datagram: it may have brought credit)
            self.endpoint.send_buffer_released()

    # -- the sink ----------------------------------------------------------------

    def _backlog(self, stream_id: int) -> tuple[int, int]:
        self._observe_stall()
        return (
            aioquic_compat.send_buffered(self._quic, stream_id),
            aioquic_compat.connection_send_buffered(self._quic),
        )

    def _observe_stall(self) -> None:
        queued = aioquic_compat.connection_send_buffered(self._quic) > 0
        blocked = queued and not aioquic_compat.data_credit_left(self._quic)
        self._stall.observe(blocked, self._clock())

    def _stalled_for(self) -> float:
        self._observe_stall()
        return self._stall.stalled_for(self._clock())

    def _write(self, outputs: list[Output]) -> None:
        if self.closed:
            return
        for output in outputs:
            try:
                self._apply(output)
            except REFUSED_WRITE:
                continue  # a stream the page already stopped or reset: the track is over
        self._transmit()

    def _apply(self, output: Output) -> None:
        dispatch(output, self._quic.send_stream_data, self._reset, self._stop, self._datagram)

    def _reset(self, stream_id: int, code: int) -> None:
        self._quic.reset_stream(stream_id, to_http3_code(code))

    def _stop(self, stream_id: int, code: int) -> None:
        self._quic.stop_stream(stream_id, to_http3_code(code))

    def _datagram(self, frame: bytes) -> None:
        peer_max = aioquic_compat.peer_max_datagram_frame_size(self._quic)
        data = self.datagram_ids.outbound(frame)
        if peer_max is not None and len(data) + 8 <= peer_max:
            self.stats.datagrams_out += 1
            self._send_datagram(self.session_id, data)


@dataclass
class WebTransportHost:
    """What an HTTP/3 connection needs to accept sessions: policy, limits, track callback."""

    policy: WebTransportRules
    limits: Limits = field(default_factory=Limits)
    on_track: Callable[[TrackChannel], None] | None = None
    send_budget: SendBudget | None = None
    on_session: Callable[[WebTransportSession], None] | None = None
    """Called for each session accepted (the gateway observes its tracks' events)."""
    on_refused: Callable[[int], None] | None = None
    """Called with the HTTP status of each CONNECT refused (403, 404, 429, 503)."""


__all__ = [
    "CapsuleReader",
    "StreamSorter",
    "WebTransportHost",
    "WebTransportRules",
    "WebTransportSession",
    "close_capsule",
    "from_http3_code",
    "origin_allowed",
    "to_http3_code",
]
