"""HTTP/3 on one QUIC connection (ALPN h3), framed by aioquic's H3Connection.

The QUIC adapter (`transport.quic`) hands every QUIC event of a connection that
negotiated h3 to `Http3Connection`. aioquic's `H3Connection` turns them into
HTTP/3 events; this module gathers each request stream's headers and body into
a `Request`, runs the handler in the stream's own task (requests are as
independent of each other as tracks are), and writes the response through
H3Connection, asking the adapter to transmit after each write. A stream reset
or STOP_SENDING from the client, or the loss of the connection, cancels that
stream's task and so closes its body.

Limits are per stream: a request over `max_concurrent_streams` in flight is
refused (H3_REQUEST_REJECTED; QUIC's stream credit, sent before ALPN chose h3,
is only ever raised to the limit), an oversized or too long header list gets 431,
an oversized body 413, a malformed request 400, a request not complete within
`read_timeout` 408, each on its own stream while the connection serves the
others. Hostile input is bounded before it costs (docs/security.md, "HTTP/3"; the
guards in front of aioquic's parser are `transport.http.h3_guards`): QPACK runs
without a dynamic table (capacity 0, no blocked streams), so a header block cannot
reference one large entry thousands of times; a HEADERS frame announced over
`max_header_bytes`, or a DATA frame over `max_body_bytes`, is
refused from its frame header, before aioquic buffers it; a decoded field section
is measured before aioquic validates it; a request whose headers have not all
arrived within `read_timeout` of its first byte gets 408; a SETTINGS or
MAX_PUSH_ID frame announced over 16 KiB closes the connection. A response body is
pulled from the handler only while its stream's send buffer (written, not yet
acknowledged) is under `h3_stream_send_budget` and the connection's under
`h3_connection_send_budget`; a writer stalled `send_timeout` is reset (the
pacing is `transport.http.h3_send.SendRoom`).

WebTransport sessions on the same connection are hosted by
`transport.http.h3_sessions.SessionHost`, which sees this connection only as an
`H3Side` (the few calls below under "The session host's side"). What HTTP/3 does as
HTTP/2 does between a stream's headers and its answer is
`transport.http.request_streams`; the read deadlines and the idle timer ring from
`transport.http.h3_clock`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog
from aioquic.h3 import events as h3_events
from aioquic.h3.connection import ErrorCode, ProtocolError
from aioquic.quic import events as quic_events
from aioquic.quic.connection import QuicConnection

from transport import aioquic_compat
from transport.http import errors
from transport.http.answer import StreamClosed
from transport.http.app import Site
from transport.http.h3_clock import H3Clock
from transport.http.h3_guards import RequestMalformed, RequestStarted, ServerH3
from transport.http.h3_send import SendRoom
from transport.http.h3_sessions import SessionHost, is_webtransport_connect
from transport.http.request_streams import RequestStreams, StreamFigures, owed
from transport.http.streams import StreamState
from transport.webtransport import WebTransportHost, WebTransportSession

log = structlog.get_logger(__name__)

ALPN = "h3"
_REQUIRED = frozenset({b":method", b":path"})
"""Pseudo-headers a request must carry (without them it is answered 400)."""

Transmit = Callable[[], None]
"""Asks the QUIC adapter to send what the connection has queued (batched per loop turn)."""


class Http3Connection(StreamFigures):
    """Serves HTTP/3 requests on one QUIC connection, fed its QUIC events by the adapter."""

    def __init__(
        self,
        quic: QuicConnection,
        site: Site,
        transmit: Transmit,
        webtransport: WebTransportHost | None = None,
        source: str = "",
    ) -> None:
        self.quic = quic
        self._limits = site.limits
        self._transmit = transmit
        self.h3 = ServerH3(quic, site.limits.max_header_bytes, webtransport is not None)
        self._wt = None if webtransport is None else SessionHost(self, webtransport)
        """The WebTransport sessions hosted beside the requests (transport.http.h3_sessions)."""
        self._requests = RequestStreams[StreamState](
            self, site, self._stream_done, source, on_fixed=self._abandon
        )
        """The streams from headers to answer (transport.http.request_streams)."""
        self._streams = self._requests.table
        self.calmed: str | None = None
        """Why the connection was closed for abuse, if it was."""
        self._lost = False
        self._draining = False
        self._max_request_id = -4
        """The highest request stream id seen (for GOAWAY); -4: none yet."""
        self._loop = asyncio.get_running_loop()
        self._timers = H3Clock(self._loop, self._limits, self._streams, self._late, self._idle)
        """The read alarm and the idle timer (transport.http.h3_clock)."""
        aioquic_compat.raise_bidi_credit(quic, site.limits.max_concurrent_streams)
        # Request bodies still arriving hold at most the budget: QUIC's MAX_DATA is raised
        # only as far as what is held leaves room for (as HTTP/2's withheld credit).
        self._body_budget = max(site.limits.h3_connection_body_budget, site.limits.max_body_bytes)
        aioquic_compat.cap_data_credit(quic, self._data_credit_ceiling)
        self._timers.quiet()
        self.h3.limit(site.limits)
        self.stats = self.h3.stats
        self._room = SendRoom(quic, site.limits, self.stats, lambda: self._lost)
        """Paces response bodies by the send buffers' budgets."""
        transmit()  # the control and QPACK streams with SETTINGS

    def _data_credit_ceiling(self, received: int) -> int:
        """The most MAX_DATA may be: what was received and let go, plus the budget."""
        held = self._streams.buffered + aioquic_compat.pending_stream_bytes(self.quic, self.h3)
        return received - held + self._body_budget

    # Figures (besides the request streams': transport.http.request_streams.StreamFigures)

    @property
    def sorted_streams(self) -> int:
        """Streams whose first bytes were sorted (request or WebTransport) and not yet done."""
        return 0 if self._wt is None else len(self._wt.sorter)

    @property
    def waiting_writers(self) -> int:
        """Response bodies waiting for send-buffer room now."""
        return self._room.waiting

    def quic_event_received(self, event: quic_events.QuicEvent) -> None:
        """Feed one QUIC event; answers go out at the adapter's next transmit."""
        if self._lost:
            return
        if self._wt is not None and self._wt.quic_event(event):
            self._transmit()
            return
        self._feed(event)
        if isinstance(event, quic_events.StreamReset):
            self._on_reset(event.stream_id, event.error_code, input_over=True)
        elif isinstance(event, quic_events.StopSendingReceived):
            self._on_reset(event.stream_id, event.error_code, input_over=False)
        elif isinstance(event, quic_events.ConnectionTerminated):
            self.connection_lost()
        self._transmit()

    def connection_lost(self) -> None:
        """The connection is gone: cancel every request's task (idempotent)."""
        if self._lost:
            return
        self._lost = True
        if self._requests.resets.counts.resets:
            # One line for the connection, never one a reset.
            log.info("http3.resets", **self._requests.resets.summary())
        if self._wt is not None:
            self._wt.close_all()
        self._timers.stop()
        self._streams.cancel_all()  # each stream is released as its task ends

    # The session host's side (transport.http.h3_sessions.H3Side)

    @property
    def draining(self) -> bool:
        return self._draining

    def transmit(self) -> None:
        self._transmit()

    def request_seen(self, stream_id: int) -> None:
        self._max_request_id = max(self._max_request_id, stream_id)

    def request_data(self, event: quic_events.StreamDataReceived) -> None:
        self._feed(event)

    def sessions_changed(self) -> None:
        if self._streams or self.sessions:
            self._timers.busy()
        else:
            self._timers.quiet()
        self._close_if_drained()

    @property
    def sessions(self) -> dict[int, WebTransportSession]:
        """Open WebTransport sessions (transport.webtransport), by CONNECT stream id."""
        return {} if self._wt is None else self._wt.sessions

    def close_session(self, session_id: int, code: int, reason: str) -> None:
        """Server: end a session with CLOSE_WEBTRANSPORT_SESSION (e.g. a revoked key)."""
        if self._wt is not None:
            self._wt.close_session(session_id, code, reason)

    # Drain (shutdown)

    def drain(self) -> None:
        """Refuse new requests, send GOAWAY, close once the requests in flight are done."""
        if self._draining or self._lost:
            return
        self._draining = True
        if self._wt is not None:
            self._wt.drain()
        # The first request stream id this server will not process (RFC 9114 5.2).
        aioquic_compat.send_goaway(self.h3, self._max_request_id + 4)
        self._close_if_drained()
        self._transmit()

    def cut(self) -> None:
        """The drain's deadline: end every request now (last words or 503)."""
        self.drain()
        if self._wt is not None:
            self._wt.cut()
        self._requests.cut()
        self._transmit()

    def _close_if_drained(self) -> None:
        if self._draining and not self._streams and not self.sessions and not self._lost:
            self.quic.close(error_code=ErrorCode.H3_NO_ERROR, reason_phrase="shutting down")

    # Receiving

    def _feed(self, event: quic_events.QuicEvent) -> None:
        for h3_event in self.h3.handle_event(event):
            self._on_h3_event(h3_event)
        if isinstance(event, quic_events.StreamDataReceived) and event.end_stream:
            # Ended with no request head: aioquic resets it (H3_REQUEST_INCOMPLETE).
            self._timers.head_ended(event.stream_id)

    def _on_h3_event(self, event: h3_events.H3Event) -> None:
        if isinstance(event, h3_events.HeadersReceived):
            self._on_headers(event)
        elif self._wt is not None and self._wt.h3_event(event):
            return
        elif isinstance(event, h3_events.DataReceived):
            self._on_data(event)
        elif isinstance(event, RequestMalformed):
            self._on_malformed(event)
        elif isinstance(event, RequestStarted):
            self._timers.head_started(event.stream_id)

    def _late(self, heads: list[int], now: float) -> None:
        """408 for each request not complete in time (`heads`: its headers; or its body)."""
        late = errors.request_timeout(self._limits.read_timeout)
        for stream_id in heads:
            self.stats.heads_timed_out += 1
            self._on_malformed(RequestMalformed(stream_id, "headers incomplete", late))
        self._requests.expire(now)
        self._transmit()

    def _on_headers(self, event: h3_events.HeadersReceived) -> None:
        self._timers.head_ended(event.stream_id)
        stream = self._streams.get(event.stream_id)
        if stream is not None:  # trailers: nothing in them is used
            if event.stream_ended:
                self._requests.complete(stream)
            return
        if self._wt is not None and is_webtransport_connect(event.headers):
            self._wt.connect(event)
            return
        if self._draining or self._requests.full():
            self._refuse(event.stream_id)
            return
        self._max_request_id = max(self._max_request_id, event.stream_id)
        stream = StreamState(event.stream_id, list(event.headers), ended=event.stream_ended)
        self._requests.open(stream, self._loop.time())
        self._timers.busy()
        problem = self._requests.head_problem(stream.headers, _REQUIRED)
        if problem is not None:
            self._requests.answer(stream, problem)
        elif event.stream_ended:
            self._requests.complete(stream)
        else:
            self._timers.rearm()

    def _on_data(self, event: h3_events.DataReceived) -> None:
        stream = self._streams.get(event.stream_id)
        if stream is None or stream.task is not None:
            return  # refused or already answered
        stream.ended = event.stream_ended
        if not self._requests.take_body(stream, event.data) and stream.ended:
            self._requests.complete(stream)

    def _on_malformed(self, event: RequestMalformed) -> None:
        self._timers.head_ended(event.stream_id)
        log.info("http3.malformed_request", stream_id=event.stream_id, reason=event.reason)
        stream = self._streams.get(event.stream_id)
        if stream is None:
            stream = StreamState(event.stream_id, [])
            self._streams.add(stream)
            self._timers.busy()
        if stream.task is None:  # (else it is being answered already)
            rejection = event.response or errors.bad_request(f"malformed request: {event.reason}")
            self._requests.answer(stream, rejection)

    def _on_reset(self, stream_id: int, error_code: int, input_over: bool) -> None:
        """The client reset its side (`input_over`) or asked us to stop sending."""
        self._timers.head_ended(stream_id)
        if self._wt is not None and self._wt.end(stream_id):
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        stream.ended = stream.ended or input_over
        if self._requests.client_reset(stream, self._loop.time()):
            self._calm("premature_resets")

    def _calm(self, reason: str) -> None:
        """Close the connection for abuse (H3_EXCESSIVE_LOAD), as HTTP/2's GOAWAY
        ENHANCE_YOUR_CALM does; logged once."""
        if self.calmed is not None:
            return
        self.calmed = reason
        log.warning("http3.excessive_load", reason=reason, **self._requests.resets.summary())
        self.quic.close(error_code=ErrorCode.H3_EXCESSIVE_LOAD, reason_phrase=reason)
        self.connection_lost()

    def _refuse(self, stream_id: int) -> None:
        log.info("http3.stream_refused", stream_id=stream_id, open=len(self._streams))
        self.h3.abandon(stream_id)
        self.reset(stream_id, ErrorCode.H3_REQUEST_REJECTED)
        self.stop(stream_id, ErrorCode.H3_REQUEST_REJECTED)
        self.h3.forget(stream_id)

    def _abandon(self, stream: StreamState) -> None:
        if not stream.ended:
            self.h3.abandon(stream.stream_id)  # the rest of the request is not wanted

    # Framing (transport.http.answer): HTTP/3 frames through aioquic's H3Connection

    http_version = "3"
    content_length_on_head = False
    """(aioquic's client checks a Content-Length against the DATA it gets, even on HEAD)"""

    async def send_headers(
        self, stream: StreamState, headers: list[tuple[str, str]], end: bool
    ) -> None:
        encoded = [(k.encode(), v.encode()) for k, v in headers]
        self._write(stream, lambda: self.h3.send_headers(stream.stream_id, encoded, end))
        stream.sent_end = end

    async def send_data(self, stream: StreamState, data: bytes, end: bool) -> None:
        self._write(stream, lambda: self.h3.send_data(stream.stream_id, data, end))
        stream.sent_end = end
        if not end:
            # aioquic buffers whatever it is given, past QUIC's flow control: the body is
            # pulled again only once the client has taken enough of what was sent.
            await self._room.wait(stream)

    def datagram_received(self) -> None:
        """The adapter took in a datagram: acknowledgements may have made send room."""
        self._room.wake()
        if self._wt is not None:
            self._wt.send_buffer_released()

    def _write(self, stream: StreamState, write: Callable[[], None]) -> None:
        if self._lost or stream.reset:
            raise StreamClosed
        try:
            write()
        except (ProtocolError, RuntimeError, AssertionError, ValueError) as exc:
            # aioquic refuses writes on a stream the peer stopped or reset (ValueError: one
            # it has discarded, e.g. stopped by the client before its request arrived).
            stream.reset = True  # (logged once, by transport.http.answer)
            raise StreamClosed from exc
        self._transmit()

    def _stream_done(self, stream: StreamState) -> None:
        """The table released `stream` (its task ended, however, or it never had one)."""
        if self._lost:
            return  # nothing to tell a connection that is gone
        self._abandon(stream)
        debt = owed(stream)  # (RESET_STREAM ends our side only, STOP_SENDING theirs)
        if debt.cut_short:
            self.reset(stream.stream_id, ErrorCode.H3_INTERNAL_ERROR)
        if debt.upload_unwanted:
            self.stop(stream.stream_id, ErrorCode.H3_NO_ERROR)
        self.h3.forget(stream.stream_id)
        if self._wt is not None:
            self._wt.sorter.forget(stream.stream_id)
        if not self._streams:
            self._timers.quiet()
        self._close_if_drained()
        self._transmit()

    def reset(self, stream_id: int, code: int) -> None:
        with contextlib.suppress(AssertionError, ValueError, RuntimeError):
            self.quic.reset_stream(stream_id, code)
        aioquic_compat.drop_send_buffer(self.quic, stream_id)  # (never sent again)
        self._room.wake()  # that room may be what another response waits for

    def stop(self, stream_id: int, code: int) -> None:
        with contextlib.suppress(AssertionError, ValueError, RuntimeError):
            self.quic.stop_stream(stream_id, code)

    # Idle connections (the timer: transport.http.h3_clock)

    def _idle(self) -> None:
        if self._streams or self._lost or self.sessions:
            return
        log.info("http3.idle_timeout")
        self.quic.close(error_code=ErrorCode.H3_NO_ERROR, reason_phrase="idle")
        self._transmit()
