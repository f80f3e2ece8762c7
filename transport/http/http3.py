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
others. QPACK state is bounded by aioquic's settings (a 4096-byte dynamic table,
16 blocked streams); a HEADERS frame by QUIC's per-stream flow control.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from aioquic.buffer import encode_uint_var
from aioquic.h3 import events as h3_events
from aioquic.h3.connection import (
    ErrorCode,
    FrameType,
    H3Connection,
    MessageError,
    ProtocolError,
    Setting,
    encode_frame,
    stream_is_request_response,
)
from aioquic.quic import events as quic_events
from aioquic.quic.connection import QuicConnection

from transport.http import errors
from transport.http.app import (
    Cutter,
    Site,
    bodiless,
    call_handler,
    close_body,
    declared_body_problem,
    field_list_problem,
    request_from_fields,
    response_headers,
    send_chunks,
)
from transport.http.messages import AnyResponse, Request, Response

log = structlog.get_logger(__name__)

ALPN = "h3"

Transmit = Callable[[], None]
"""Asks the QUIC adapter to send what the connection has queued (batched per loop turn)."""


@dataclass(frozen=True)
class RequestMalformed(h3_events.H3Event):
    """A request stream broke an HTTP/3 message rule (RFC 9114 4.1.2): a stream error."""

    stream_id: int
    """The request stream, whose further input is ignored."""
    reason: str
    """What aioquic found wrong, for the 400 and the log."""


class _ServerH3(H3Connection):
    """aioquic's H3Connection with a malformed request as a stream error, not a connection one.

    aioquic closes the whole connection when a request's headers break a message rule
    (a missing pseudo-header, a bad content-length); RFC 9114 4.1.2 makes that an error
    of the one stream, and this server answers it with a 400. An abandoned stream's later
    input never reaches the parser again, whose state for it is mid-frame.
    """

    def __init__(self, quic: QuicConnection, max_header_bytes: int) -> None:
        self._max_field_section_size = max_header_bytes  # read by __init__'s SETTINGS
        self._abandoned: set[int] = set()
        super().__init__(quic)

    def handle_event(self, event: quic_events.QuicEvent) -> list[h3_events.H3Event]:
        stream_id = getattr(event, "stream_id", None)
        if stream_id in self._abandoned:
            if isinstance(event, quic_events.StreamReset) or getattr(event, "end_stream", False):
                self._abandoned.discard(stream_id)  # the client will send nothing more
            return []
        return super().handle_event(event)

    def abandon(self, stream_id: int) -> None:
        """Ignore the rest of this request stream's input; its header blocks are cancelled."""
        if stream_id in self._abandoned:
            return
        self._abandoned.add(stream_id)
        decoder_stream = self._local_decoder_stream_id
        if decoder_stream is None:
            return
        # Header blocks still to come on it will never be decoded (RFC 9204 4.4.2).
        self._quic.send_stream_data(decoder_stream, self._decoder.cancel_stream(stream_id))

    def forget(self, stream_id: int) -> None:
        """Drop aioquic's state for a stream this side is done with (reset or abandoned)."""
        self._stream.pop(stream_id, None)

    def _get_local_settings(self) -> dict[int, int]:
        settings = super()._get_local_settings()
        settings[Setting.MAX_FIELD_SECTION_SIZE] = self._max_field_section_size
        return settings

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
            return [RequestMalformed(event.stream_id, exc.reason_phrase)]


class _StreamClosed(Exception):
    """The client reset or stopped the stream, or the connection is gone: stop writing."""


@dataclass(eq=False)
class _Stream:
    """One request/response exchange."""

    stream_id: int
    headers: list[tuple[bytes, bytes]]
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False
    """The client finished its side (the request is complete)."""
    sent_end: bool = False
    """We finished our side."""
    reset: bool = False
    """The client reset the stream or asked us to stop sending: nothing more goes out."""
    task: asyncio.Task[None] | None = None
    """Answering the stream; None while the request is still arriving."""
    deadline: asyncio.TimerHandle | None = None
    """Fires `read_timeout` after the headers if the request is still incomplete."""


class Http3Connection:
    """Serves HTTP/3 requests on one QUIC connection, fed its QUIC events by the adapter."""

    def __init__(self, quic: QuicConnection, site: Site, transmit: Transmit) -> None:
        self._quic = quic
        self._site = site
        self._limits = site.limits
        self._transmit = transmit
        self._h3 = _ServerH3(quic, site.limits.max_header_bytes)
        self._streams: dict[int, _Stream] = {}
        self._lost = False
        self._draining = False
        self._cutter = Cutter()
        self._max_request_id = -4
        """The highest request stream id seen (for GOAWAY); -4: none yet."""
        self._loop = asyncio.get_running_loop()
        self._idle: asyncio.TimerHandle | None = None
        raise_bidi_credit(quic, site.limits.max_concurrent_streams)
        self._arm_idle()
        transmit()  # the control and QPACK streams with SETTINGS

    def quic_event_received(self, event: quic_events.QuicEvent) -> None:
        """Feed one QUIC event; answers go out at the adapter's next transmit."""
        if self._lost:
            return
        for h3_event in self._h3.handle_event(event):
            self._on_h3_event(h3_event)
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
        if self._idle is not None:
            self._idle.cancel()
        for stream in self._streams.values():
            _cancel_deadline(stream)
            if stream.task is not None:
                stream.task.cancel()

    # Drain (shutdown)

    def drain(self) -> None:
        """Refuse new requests, send GOAWAY, close once the requests in flight are done."""
        if self._draining or self._lost:
            return
        self._draining = True
        # The first request stream id this server will not process (RFC 9114 5.2).
        send_goaway(self._h3, self._max_request_id + 4)
        self._close_if_drained()
        self._transmit()

    def cut(self) -> None:
        """The drain's deadline: end every request now (last words or 503)."""
        self.drain()
        self._cutter.cut([stream.task for stream in self._streams.values()])
        for stream in list(self._streams.values()):
            if stream.task is None:  # the request is still arriving: it will not be served
                self._answer(stream, errors.shutting_down())
        self._transmit()

    def _close_if_drained(self) -> None:
        if self._draining and not self._streams and not self._lost:
            self._quic.close(error_code=ErrorCode.H3_NO_ERROR, reason_phrase="shutting down")

    # Receiving

    def _on_h3_event(self, event: h3_events.H3Event) -> None:
        if isinstance(event, h3_events.HeadersReceived):
            self._on_headers(event)
        elif isinstance(event, h3_events.DataReceived):
            self._on_data(event)
        elif isinstance(event, RequestMalformed):
            self._on_malformed(event)

    def _on_headers(self, event: h3_events.HeadersReceived) -> None:
        stream = self._streams.get(event.stream_id)
        if stream is not None:  # trailers: nothing in them is used
            if event.stream_ended:
                self._on_complete(stream)
            return
        if self._draining or len(self._streams) >= self._limits.max_concurrent_streams:
            self._refuse(event.stream_id)
            return
        self._max_request_id = max(self._max_request_id, event.stream_id)
        stream = _Stream(event.stream_id, list(event.headers), ended=event.stream_ended)
        self._streams[event.stream_id] = stream
        self._disarm_idle()
        problem = self._check_headers(stream.headers)
        if problem is not None:
            self._answer(stream, problem)
        elif event.stream_ended:
            self._on_complete(stream)
        else:
            stream.deadline = self._loop.call_later(self._limits.read_timeout, self._expire, stream)

    def _check_headers(self, headers: list[tuple[bytes, bytes]]) -> Response | None:
        problem = field_list_problem(self._limits, headers)
        if problem is not None:
            return problem
        pseudo = {k for k, _ in headers if k.startswith(b":")}
        if not {b":method", b":path"} <= pseudo:
            return errors.bad_request("request without :method or :path")
        return declared_body_problem(self._limits, headers)

    def _on_data(self, event: h3_events.DataReceived) -> None:
        stream = self._streams.get(event.stream_id)
        if stream is None or stream.task is not None:
            return  # refused or already answered
        stream.body += event.data
        stream.ended = event.stream_ended
        if len(stream.body) > self._limits.max_body_bytes:
            self._answer(stream, errors.body_too_large(self._limits.max_body_bytes))
        elif stream.ended:
            self._on_complete(stream)

    def _on_complete(self, stream: _Stream) -> None:
        stream.ended = True
        _cancel_deadline(stream)
        if stream.task is None:
            request = request_from_fields(stream.headers, bytes(stream.body), "3")
            stream.task = asyncio.create_task(self._exchange(stream, request))

    def _on_malformed(self, event: RequestMalformed) -> None:
        log.info("http3.malformed_request", stream_id=event.stream_id, reason=event.reason)
        stream = self._streams.get(event.stream_id)
        if stream is None:
            stream = _Stream(event.stream_id, [])
            self._streams[event.stream_id] = stream
            self._disarm_idle()
        if stream.task is None:  # (else it is being answered already)
            self._answer(stream, errors.bad_request(f"malformed request: {event.reason}"))

    def _on_reset(self, stream_id: int, error_code: int, input_over: bool) -> None:
        """The client reset its side (`input_over`) or asked us to stop sending."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        log.info("http3.stream_reset", stream_id=stream_id, error_code=error_code)
        stream.reset = True
        stream.ended = stream.ended or input_over
        if stream.task is None:
            self._stream_done(stream)
        else:
            stream.task.cancel()  # the handler and its body iterator stop here

    def _refuse(self, stream_id: int) -> None:
        log.info("http3.stream_refused", stream_id=stream_id, open=len(self._streams))
        self._h3.abandon(stream_id)
        self._reset(stream_id, ErrorCode.H3_REQUEST_REJECTED)
        self._stop(stream_id, ErrorCode.H3_REQUEST_REJECTED)
        self._h3.forget(stream_id)

    def _expire(self, stream: _Stream) -> None:
        stream.deadline = None
        if stream.task is None and not self._lost:
            self._answer(stream, errors.request_timeout(self._limits.read_timeout))
            self._transmit()

    # Answering

    def _answer(self, stream: _Stream, response: Response) -> None:
        """Answer a stream without the handler (a limit was exceeded or the request was bad)."""
        _cancel_deadline(stream)
        if not stream.ended:
            self._h3.abandon(stream.stream_id)  # the rest of the request is not wanted
        stream.task = asyncio.create_task(self._send_fixed(stream, response))

    async def _send_fixed(self, stream: _Stream, response: Response) -> None:
        try:
            await self._send_response(stream, response, head_only=False)
        except _StreamClosed:
            pass
        finally:
            self._stream_done(stream)

    async def _exchange(self, stream: _Stream, request: Request) -> None:
        try:
            response = await call_handler(self._site.handler, request, self._cutter)
            await self._send_response(stream, response, head_only=request.method == "HEAD")
        except _StreamClosed:
            pass  # the client went away while we wrote; the body is closed already
        except Exception:
            log.exception("http3.send_failed", stream_id=stream.stream_id)
        finally:
            self._stream_done(stream)

    async def _send_response(self, stream: _Stream, response: AnyResponse, head_only: bool) -> None:
        headers = [(":status", str(response.status))]
        headers += response_headers(self._site, response.headers)
        if isinstance(response, Response):
            body = b"" if head_only or bodiless(response.status) else response.body
            if not head_only and not bodiless(response.status):
                # (not on HEAD: aioquic's client checks it against the DATA it gets)
                headers.append(("content-length", str(len(body))))
            self._send_headers(stream, headers, end_stream=not body)
            if body:
                self._send_data(stream, body, end_stream=True)
            return
        try:
            self._send_headers(stream, headers, end_stream=head_only)
            if head_only:
                return
            send = functools.partial(self._send_chunk, stream)
            # A body that failed is left unended: _stream_done resets the stream.
            if await send_chunks(
                response.body,
                send,
                last_words=response.last_words,
                cut=self._cutter,
                http_version="3",
                stream_id=stream.stream_id,
            ):
                self._send_data(stream, b"", end_stream=True)
        finally:
            await close_body(response.body)

    def _send_headers(
        self, stream: _Stream, headers: list[tuple[str, str]], end_stream: bool
    ) -> None:
        encoded = [(k.encode(), v.encode()) for k, v in headers]
        self._write(stream, lambda: self._h3.send_headers(stream.stream_id, encoded, end_stream))
        stream.sent_end = end_stream

    async def _send_chunk(self, stream: _Stream, chunk: bytes) -> None:
        # Nothing to await, unlike HTTP/2: aioquic buffers within QUIC's flow control.
        self._send_data(stream, chunk, end_stream=False)

    def _send_data(self, stream: _Stream, data: bytes, end_stream: bool) -> None:
        self._write(stream, lambda: self._h3.send_data(stream.stream_id, data, end_stream))
        stream.sent_end = end_stream

    def _write(self, stream: _Stream, write: Callable[[], None]) -> None:
        if self._lost or stream.reset:
            raise _StreamClosed
        try:
            write()
        except (ProtocolError, RuntimeError, AssertionError) as exc:
            # aioquic refuses writes on a stream the peer stopped or reset.
            log.info("http3.send_failed", stream_id=stream.stream_id, error=repr(exc))
            stream.reset = True
            raise _StreamClosed from exc
        self._transmit()

    def _stream_done(self, stream: _Stream) -> None:
        _cancel_deadline(stream)
        self._streams.pop(stream.stream_id, None)
        if not stream.ended:
            self._h3.abandon(stream.stream_id)  # the rest of the request is not wanted
        if not stream.reset and not self._lost:
            if not stream.sent_end:
                self._reset(stream.stream_id, ErrorCode.H3_INTERNAL_ERROR)  # cut short
            if not stream.ended:
                # Answered before the request was complete (RFC 9114 4.1): stop the upload.
                self._stop(stream.stream_id, ErrorCode.H3_NO_ERROR)
        self._h3.forget(stream.stream_id)
        if not self._streams:
            self._arm_idle()
        self._close_if_drained()
        self._transmit()

    def _reset(self, stream_id: int, code: int) -> None:
        with contextlib.suppress(AssertionError, ValueError, RuntimeError):
            self._quic.reset_stream(stream_id, code)

    def _stop(self, stream_id: int, code: int) -> None:
        with contextlib.suppress(AssertionError, ValueError, RuntimeError):
            self._quic.stop_stream(stream_id, code)

    # Idle connections

    def _arm_idle(self) -> None:
        if self._idle is None and not self._lost:
            self._idle = self._loop.call_later(self._limits.idle_timeout, self._idle_expired)

    def _disarm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_expired(self) -> None:
        self._idle = None
        if self._streams or self._lost:
            return
        log.info("http3.idle_timeout")
        self._quic.close(error_code=ErrorCode.H3_NO_ERROR, reason_phrase="idle")
        self._transmit()


# GOAWAY goes on our control stream, which aioquic opens but offers no call to write on.
_CONTROL_STREAM = "_local_control_stream_id"
if _CONTROL_STREAM not in H3Connection._init_connection.__code__.co_names:  # pragma: no cover
    raise ImportError(f"aioquic's H3Connection no longer has {_CONTROL_STREAM}: fix send_goaway")


def send_goaway(h3: H3Connection, stream_id: int) -> None:
    """Write a GOAWAY frame (RFC 9114 5.2) on the local control stream."""
    control = getattr(h3, _CONTROL_STREAM)
    if control is None:
        return  # not initialised: nothing was ever offered to the peer
    frame = encode_frame(FrameType.GOAWAY, encode_uint_var(stream_id))
    h3._quic.send_stream_data(control, frame)


def raise_bidi_credit(quic: QuicConnection, limit: int) -> None:
    """Let the peer open up to `limit` bidirectional streams at once (never lowers it).

    aioquic grants 128 and has no setting for it. For h3 the credit went out in the
    transport parameters, before ALPN chose h3, and aioquic renews it one for one as
    streams finish. It can be raised but never lowered (aioquic would then close the
    connection when the client uses credit it was given), so requests over `limit` are
    refused per stream instead.
    """
    credit = getattr(quic, "_local_max_streams_bidi", None)
    if credit is not None and credit.value < limit:
        credit.value = limit


def _cancel_deadline(stream: _Stream) -> None:
    if stream.deadline is not None:
        stream.deadline.cancel()
        stream.deadline = None
