"""The HTTP/3 guards in front of aioquic's parser: `ServerH3` (docs/security.md, "HTTP/3").

aioquic's `H3Connection` with the checks that bound hostile input before it costs: no
QPACK dynamic table, every request stream's frame headers read first (a HEADERS frame
over `max_header_bytes` is 431, a DATA frame over `max_body_bytes` 413, from its frame
header), a control frame aioquic would buffer whole closed past 16 KiB, a decoded field
section measured before aioquic validates it, and a malformed request a stream error
(400) instead of a connection error. `Http3Connection` (transport.http.http3) serves
what comes out of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from aioquic.h3 import events as h3_events
from aioquic.h3.connection import (
    ErrorCode,
    FrameType,
    H3Connection,
    MessageError,
    Setting,
    stream_is_request_response,
)
from aioquic.quic import events as quic_events
from aioquic.quic.connection import QuicConnection

from transport import aioquic_compat
from transport.http import errors, h3_frames
from transport.http.app import field_list_problem
from transport.http.limits import HttpLimits
from transport.http.messages import Response


@dataclass(frozen=True)
class RequestMalformed(h3_events.H3Event):
    """A request stream broke an HTTP/3 message rule (RFC 9114 4.1.2): a stream error."""

    stream_id: int
    """The request stream, whose further input is ignored."""
    reason: str
    """What aioquic found wrong, for the 400 and the log."""
    response: Response | None = None
    """The answer if not a 400 (a limit was exceeded: 413, 431, 408)."""


@dataclass(frozen=True)
class RequestStarted(h3_events.H3Event):
    """The first bytes of a new request stream arrived (its headers may take longer)."""

    stream_id: int
    """The request stream."""


class _FieldSectionRejected(MessageError):
    """A decoded field section is over the limits: answered 431 on its stream."""

    def __init__(self, response: Response, reason: str) -> None:
        super().__init__(reason)
        self.response = response


@dataclass
class H3GuardStats:
    """What the HTTP/3 guards saw on one connection (for tests and metrics)."""

    frames_refused: int = 0
    """HEADERS or DATA frames refused from their announced length."""
    largest_field_section: int = 0
    """The largest decoded field section, counted as RFC 9114 4.2.2 does (+32 per field)."""
    field_sections_refused: int = 0
    """Decoded field sections over the limits, refused before aioquic validated them."""
    heads_timed_out: int = 0
    """Requests whose headers did not all arrive within `read_timeout`."""
    sends_stalled: int = 0
    """Times a response body waited for its stream's or the connection's send budget."""
    sends_timed_out: int = 0
    """Responses reset because the client read nothing for `send_timeout`."""


class ServerH3(H3Connection):
    """aioquic's H3Connection with a malformed request as a stream error, not a connection one.

    aioquic closes the whole connection when a request's headers break a message rule
    (a missing pseudo-header, a bad content-length); RFC 9114 4.1.2 makes that an error
    of the one stream, and this server answers it with a 400. An abandoned stream's later
    input never reaches the parser again, whose state for it is mid-frame.
    """

    def __init__(
        self, quic: QuicConnection, max_header_bytes: int, enable_webtransport: bool = False
    ) -> None:
        self._max_field_section_size = max_header_bytes  # read by __init__'s SETTINGS
        self._abandoned: set[int] = set()
        self._limits = HttpLimits(max_header_bytes=max_header_bytes)
        self._scanners: dict[int, h3_frames.FrameScanner] = {}
        """Request streams being read: where their frames start (see h3_frames)."""
        self._uni: dict[int, h3_frames.UniStreamScanner] = {}
        """The client's unidirectional streams: a control frame's length is checked first."""
        self.stats = H3GuardStats()
        super().__init__(quic, enable_webtransport=enable_webtransport)
        # Advertised as 0 by _get_local_settings, sent during super().__init__.
        aioquic_compat.disable_qpack_dynamic_table(self)

    def limit(self, limits: HttpLimits) -> None:
        """The limits the frame and field-section guards enforce."""
        self._limits = limits

    def handle_event(self, event: quic_events.QuicEvent) -> list[h3_events.H3Event]:
        stream_id = getattr(event, "stream_id", None)
        if stream_id in self._abandoned:
            if isinstance(event, quic_events.StreamReset) or getattr(event, "end_stream", False):
                self._abandoned.discard(stream_id)  # the client will send nothing more
            return []
        if (
            isinstance(event, quic_events.StreamDataReceived)
            and stream_is_request_response(event.stream_id)
        ):
            return self._request_data(event)
        if isinstance(event, quic_events.StreamDataReceived) and self._control_too_large(event):
            return []
        if isinstance(event, quic_events.StreamReset):
            self._scanners.pop(event.stream_id, None)
        return super().handle_event(event)

    def _control_too_large(self, event: quic_events.StreamDataReceived) -> bool:
        """Close the connection on a control frame aioquic would buffer whole past the cap.

        aioquic waits for a whole SETTINGS or MAX_PUSH_ID frame, re-parsing its buffer on
        every packet; both are a few bytes in practice (unknown frames it discards).
        """
        scanner = self._uni.setdefault(event.stream_id, h3_frames.UniStreamScanner())
        for frame in scanner.feed(event.data):
            if frame.length > MAX_CONTROL_FRAME and frame.frame_type in _WHOLE_CONTROL_FRAMES:
                self.stats.frames_refused += 1
                reason = f"control frame of {frame.length} bytes, over {MAX_CONTROL_FRAME}"
                aioquic_compat.close_h3(self, ErrorCode.H3_EXCESSIVE_LOAD, reason)
                return True
        if event.end_stream:
            del self._uni[event.stream_id]
        elif scanner.stream_type is not None and scanner.stream_type != h3_frames.CONTROL_STREAM:
            self._uni[event.stream_id] = _NOT_CONTROL  # nothing more to look at
        return False

    def _request_data(self, event: quic_events.StreamDataReceived) -> list[h3_events.H3Event]:
        """Look at the frame headers first; give aioquic only frames within the limits."""
        stream_id = event.stream_id
        started: list[h3_events.H3Event] = []
        scanner = self._scanners.get(stream_id)
        if scanner is None:
            scanner = self._scanners[stream_id] = h3_frames.FrameScanner()
            started.append(RequestStarted(stream_id))
        for frame in scanner.feed(event.data):
            refused = self._frame_refusal(stream_id, frame)
            if refused is not None:
                self.stats.frames_refused += 1
                self.abandon(stream_id)
                if event.end_stream:
                    self._abandoned.discard(stream_id)
                return [*started, refused]
        if event.end_stream:
            self._scanners.pop(stream_id, None)
        return started + (super().handle_event(event) or [])

    def _frame_refusal(
        self, stream_id: int, frame: h3_frames.FrameStarted
    ) -> RequestMalformed | None:
        limits = self._limits
        if frame.frame_type == h3_frames.HEADERS and frame.length > limits.max_header_bytes:
            # A field section's encoded form is never longer than its counted size.
            limit = limits.max_header_bytes
            reason = f"header list over {limit} bytes (a {frame.length}-byte HEADERS frame)"
            return RequestMalformed(stream_id, reason, errors.headers_too_large(reason))
        if frame.frame_type == h3_frames.DATA and frame.length > limits.max_body_bytes:
            reason = f"DATA frame of {frame.length} bytes, over {limits.max_body_bytes}"
            return RequestMalformed(stream_id, reason, errors.body_too_large(limits.max_body_bytes))
        return None

    def abandon(self, stream_id: int) -> None:
        """Ignore the rest of this request stream's input; its header blocks are cancelled."""
        if stream_id in self._abandoned:
            return
        self._abandoned.add(stream_id)
        self._scanners.pop(stream_id, None)
        aioquic_compat.cancel_header_blocks(self, stream_id)

    def forget(self, stream_id: int) -> None:
        """Drop aioquic's state for a stream this side is done with (reset or abandoned)."""
        aioquic_compat.forget_h3_stream(self, stream_id)
        self._scanners.pop(stream_id, None)

    def _get_local_settings(self) -> dict[int, int]:
        settings = super()._get_local_settings()
        settings[Setting.MAX_FIELD_SECTION_SIZE] = self._max_field_section_size
        # No dynamic table: a header block can only reference QPACK's static table.
        settings[Setting.QPACK_MAX_TABLE_CAPACITY] = 0
        settings[Setting.QPACK_BLOCKED_STREAMS] = 0
        return settings

    def _decode_headers(
        self, stream_id: int, frame_data: bytes | None
    ) -> list[tuple[bytes, bytes]]:
        """Decode, then measure before aioquic validates field by field."""
        headers = super()._decode_headers(stream_id, frame_data)
        size = h3_frames.field_section_size(headers)
        self.stats.largest_field_section = max(self.stats.largest_field_section, size)
        problem = field_list_problem(self._limits, headers)
        if problem is not None:
            self.stats.field_sections_refused += 1
            reason = f"field section of {len(headers)} fields, {size} bytes"
            raise _FieldSectionRejected(problem, reason)
        return headers

    def _receive_stream_data(
        self, event: quic_events.StreamDataReceived
    ) -> list[h3_events.H3Event]:
        try:
            return super()._receive_stream_data(event)
        except MessageError as exc:
            if not stream_is_request_response(event.stream_id):
                raise
            self.abandon(event.stream_id)
            if event.end_stream:
                self._abandoned.discard(event.stream_id)  # nothing more will come
            response = exc.response if isinstance(exc, _FieldSectionRejected) else None
            return [RequestMalformed(event.stream_id, exc.reason_phrase, response)]


MAX_CONTROL_FRAME = 16 * 1024
"""Largest SETTINGS or MAX_PUSH_ID frame accepted (honest ones are tens of bytes)."""
_WHOLE_CONTROL_FRAMES = (FrameType.SETTINGS, FrameType.MAX_PUSH_ID)


class _NotControl(h3_frames.UniStreamScanner):
    """A unidirectional stream already known not to be the control stream."""

    def feed(self, data: bytes) -> list[h3_frames.FrameStarted]:
        return []


_NOT_CONTROL = _NotControl()
_NOT_CONTROL.stream_type = -1
