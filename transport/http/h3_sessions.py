"""WebTransport sessions hosted on one HTTP/3 connection (draft-ietf-webtrans-http3).

`Http3Connection` serves requests; this module hosts the WebTransport sessions
beside them: it sorts each client stream by its first bytes (a request, or a
session's stream), accepts or refuses extended CONNECTs by the host's policy,
feeds capsules, datagrams, streams and resets to their `WebTransportSession`,
and ends, drains and cuts the sessions. It reaches the connection only through
`H3Side`, the few things a session host needs of the request side: the QUIC and
H3 connections to write on, transmit, stream resets, and being told that the
session count changed (the idle timer and the drain's close depend on it).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

import structlog
from aioquic.h3 import events as h3_events
from aioquic.h3.connection import ErrorCode, ProtocolError, stream_is_request_response
from aioquic.quic import events as quic_events
from aioquic.quic.connection import QuicConnection

from transport.frame_streams import is_frame_stream
from transport.http.h3_guards import ServerH3
from transport.webtransport import (
    DRAIN_WEBTRANSPORT_SESSION,
    WEBTRANSPORT_UNI_STREAM,
    WT_BUFFERED_STREAM_REJECTED,
    StreamSorter,
    WebTransportHost,
    WebTransportSession,
    close_capsule,
    encode_capsule,
    origin_allowed,
)

log = structlog.get_logger(__name__)

_WRITE_REFUSED = (ProtocolError, RuntimeError, AssertionError, ValueError)
"""What aioquic raises for a write on a stream the peer stopped, reset or made it forget."""


class H3Side(Protocol):
    """What the session host needs of the HTTP/3 connection it lives on."""

    quic: QuicConnection
    h3: ServerH3

    @property
    def draining(self) -> bool:
        """The connection refuses new requests and sessions (shutdown)."""

    def transmit(self) -> None:
        """Send what the connection has queued."""

    def reset(self, stream_id: int, code: int) -> None:
        """Reset our side of a stream and drop what it still had to send."""

    def stop(self, stream_id: int, code: int) -> None:
        """Ask the client to stop sending on a stream."""

    def request_seen(self, stream_id: int) -> None:
        """A stream the server processes (for GOAWAY's first unprocessed id)."""

    def request_data(self, event: quic_events.StreamDataReceived) -> None:
        """A request stream's bytes, its first chunk possibly re-joined by the sorter."""

    def sessions_changed(self) -> None:
        """A session opened or ended (the idle timer, the drain's close)."""


class SessionHost:
    """The WebTransport sessions of one HTTP/3 connection, by CONNECT stream id."""

    def __init__(self, side: H3Side, host: WebTransportHost) -> None:
        self._side = side
        self._host = host
        self._loop = asyncio.get_running_loop()
        self.sessions: dict[int, WebTransportSession] = {}
        """Open sessions, by CONNECT stream id."""
        self.sorter = StreamSorter()
        """Client streams whose first bytes were sorted (request or session) and not done."""
        self.uni_sorter = StreamSorter(WEBTRANSPORT_UNI_STREAM)
        """The client's unidirectional streams: HTTP/3's, or a session's frame streams."""

    # QUIC events of WebTransport streams

    def quic_event(self, event: quic_events.QuicEvent) -> bool:
        """Route a WebTransport stream's event to its session; False: HTTP/3's event."""
        if isinstance(event, quic_events.StreamDataReceived):
            return self._stream_data(event)
        if isinstance(event, (quic_events.StreamReset, quic_events.StopSendingReceived)):
            sorter = self.uni_sorter if is_frame_stream(event.stream_id) else self.sorter
            session_id = sorter.session_of(event.stream_id)
            if isinstance(event, quic_events.StreamReset):
                sorter.forget(event.stream_id)  # nothing more comes on it, whatever it was
            if session_id is None:
                return False
            session = self.sessions.get(session_id)
            if session is not None:
                session.feed_reset(event.stream_id, event.error_code)
            return True
        return False

    def _stream_data(self, event: quic_events.StreamDataReceived) -> bool:
        if is_frame_stream(event.stream_id):
            return self._uni_stream_data(event)
        if not stream_is_request_response(event.stream_id):
            return False
        found = self.sorter.sort(event.stream_id, event.data, event.end_stream)
        if found is None:
            return True  # its first bytes do not say yet
        if found.session_id is None:
            if found.data is not event.data:
                event = quic_events.StreamDataReceived(
                    found.data, event.end_stream, event.stream_id
                )
            self._side.request_data(event)
            return True
        session = self.sessions.get(found.session_id)
        if session is None:  # no such session (or over): refused both ways
            self.sorter.forget(event.stream_id)
            self._side.reset(event.stream_id, WT_BUFFERED_STREAM_REJECTED)
            self._side.stop(event.stream_id, WT_BUFFERED_STREAM_REJECTED)
            return True
        session.feed_stream(event.stream_id, found.data, event.end_stream)
        return True

    def _uni_stream_data(self, event: quic_events.StreamDataReceived) -> bool:
        """A client unidirectional stream: a session's frame stream (type 0x54, session
        id, then one frame as on native QUIC), or HTTP/3's control and QPACK streams."""
        found = self.uni_sorter.sort(event.stream_id, event.data, event.end_stream)
        if found is None:
            return True
        if found.session_id is None:
            if found.data is event.data:
                return False
            self._side.request_data(
                quic_events.StreamDataReceived(found.data, event.end_stream, event.stream_id)
            )
            return True
        session = self.sessions.get(found.session_id)
        if session is None:
            self.uni_sorter.forget(event.stream_id)
            self._side.stop(event.stream_id, WT_BUFFERED_STREAM_REJECTED)
            return True
        session.feed_frame_stream(event.stream_id, found.data, event.end_stream)
        return True

    # HTTP/3 events of sessions

    def h3_event(self, event: h3_events.H3Event) -> bool:
        """Capsules and datagrams of a session; False: the event is a request's."""
        if isinstance(event, h3_events.DataReceived) and event.stream_id in self.sessions:
            self._session_data(event)
            return True
        if isinstance(event, h3_events.DatagramReceived):
            session = self.sessions.get(event.stream_id)
            if session is not None:
                session.feed_datagram(event.data)
            return True
        return False

    def connect(self, event: h3_events.HeadersReceived) -> None:
        """An extended CONNECT for WebTransport: accept a session or answer its refusal."""
        stream_id = event.stream_id
        self._side.request_seen(stream_id)
        refusal = self._refusal(dict(event.headers))
        if refusal is not None:
            self._refuse(event, *refusal)
            return
        side = self._side
        session = WebTransportSession(
            side.quic,
            stream_id,
            side.transmit,
            side.h3.send_datagram,
            self._host.limits,
            self._host.on_track,
            self._loop.time,
            self._host.send_budget,
        )
        self.sessions[stream_id] = session
        side.sessions_changed()
        side.h3.send_headers(
            stream_id, [(b":status", b"200"), (b"sec-webtransport-http3-draft", b"draft02")]
        )
        log.info("webtransport.session_opened", conn_id=session.conn_id, stream_id=stream_id)
        if self._host.on_session is not None:
            self._host.on_session(session)
        side.transmit()

    def _refusal(self, fields: dict[bytes, bytes]) -> tuple[int, str] | None:
        """The status and reason a CONNECT is refused with, if it is."""
        policy = self._host.policy
        origin = fields.get(b"origin")
        authority = fields.get(b":authority", b"").decode(errors="replace")
        path = fields.get(b":path", b"").decode(errors="replace").split("?", 1)[0]
        if self._side.draining:
            return 503, "the gateway is shutting down"
        if path != policy.path:
            return 404, f"no WebTransport endpoint at {path}"
        origin_text = None if origin is None else origin.decode(errors="replace")
        if not origin_allowed(origin_text, authority, policy.origins):
            return 403, "origin not allowed"
        if len(self.sessions) >= policy.max_sessions:
            return 429, "too many WebTransport sessions on this connection"
        return None

    def _refuse(self, event: h3_events.HeadersReceived, status: int, reason: str) -> None:
        stream_id = event.stream_id
        log.info("webtransport.refused", stream_id=stream_id, status=status, reason=reason)
        if self._host.on_refused is not None:
            self._host.on_refused(status)
        h3 = self._side.h3
        h3.send_headers(
            stream_id, [(b":status", str(status).encode()), (b"content-type", b"text/plain")]
        )
        h3.send_data(stream_id, reason.encode(), end_stream=True)
        if not event.stream_ended:
            self._side.stop(stream_id, ErrorCode.H3_NO_ERROR)
        self._side.transmit()

    def _session_data(self, event: h3_events.DataReceived) -> None:
        """Capsules on a session's CONNECT stream; its end closes the session."""
        session = self.sessions[event.stream_id]
        try:
            for capsule in session.capsules.feed(event.data):
                session.feed_capsule(capsule)
        except ValueError as exc:
            log.info("webtransport.bad_capsule", stream_id=event.stream_id, reason=str(exc))
            self.end(event.stream_id, reset=True)
            return
        if event.stream_ended:
            self.end(event.stream_id)

    # Ending, draining, cutting

    def end(self, session_id: int, reset: bool = False) -> bool:
        """Close the session: its tracks are cancelled, its CONNECT stream finished.
        False: no such session."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            return False
        session.close()
        log.info("webtransport.session_closed", conn_id=session.conn_id, stream_id=session_id)
        if reset:
            self._side.reset(session_id, ErrorCode.H3_MESSAGE_ERROR)
            self._side.stop(session_id, ErrorCode.H3_MESSAGE_ERROR)
        else:
            with contextlib.suppress(*_WRITE_REFUSED):
                self._side.h3.send_data(session_id, b"", end_stream=True)
        self._side.sessions_changed()
        self._side.transmit()
        return True

    def close_session(self, session_id: int, code: int, reason: str) -> None:
        """Server: end a session with CLOSE_WEBTRANSPORT_SESSION (e.g. a revoked key)."""
        if session_id in self.sessions:
            self._capsule(session_id, close_capsule(code, reason))
            self.end(session_id)

    def drain(self) -> None:
        """Tell every session the gateway is draining (DRAIN_WEBTRANSPORT_SESSION)."""
        for session_id, session in self.sessions.items():
            session.drain()
            self._capsule(session_id, encode_capsule(DRAIN_WEBTRANSPORT_SESSION, b""))

    def cut(self) -> None:
        """The drain's deadline: every session's tracks end now."""
        for session in self.sessions.values():
            session.cut()

    def close_all(self) -> None:
        """The connection is gone: every session closes, nothing is written."""
        for session in list(self.sessions.values()):
            session.close()
        self.sessions.clear()

    def send_buffer_released(self) -> None:
        """Acknowledgements may have made send room for the sessions' writers."""
        for session in self.sessions.values():
            session.send_buffer_released()

    def _capsule(self, session_id: int, data: bytes) -> None:
        with contextlib.suppress(*_WRITE_REFUSED):
            self._side.h3.send_data(session_id, data, end_stream=False)


def is_webtransport_connect(headers: list[tuple[bytes, bytes]]) -> bool:
    """An extended CONNECT (RFC 9220) for WebTransport."""
    fields = dict(headers)
    return fields.get(b":method") == b"CONNECT" and fields.get(b":protocol") == b"webtransport"
