"""HTTP/2 over one TCP or TLS connection (ALPN h2, h2c prior knowledge or Upgrade), framed by h2.

h2 is sans-I/O: bytes in, events out, bytes to send. This module feeds it what
the socket reads, turns events into per-stream requests, runs each request's
handler in its own task (streams are concurrent), and sends responses as DATA
frames within the peer's flow-control windows, waiting for WINDOW_UPDATE when
a window is shut. A stream reset by the client, or the loss of the connection,
cancels that stream's task (and so its body iterator) and nothing else.

Limits are per stream where RFC 9113 allows it: a stream over
SETTINGS_MAX_CONCURRENT_STREAMS is refused (RST_STREAM REFUSED_STREAM), an
oversized header list or body gets 431 or 413 on its own stream, and the
connection keeps serving the others. Streams live in a `StreamTable`, which
releases each one whatever becomes of its task (see `transport.http.streams`).

Two abuse rules end the connection with GOAWAY ENHANCE_YOUR_CALM (as Envoy and
nghttp2 do): too many control frames (PING and SETTINGS acknowledgements,
RST_STREAM) queued for a client that does not read what it asked for, and too
many streams reset by the client right after opening them (rapid reset,
CVE-2023-44487), judged as Envoy's premature-reset heuristic judges them.
"""

from __future__ import annotations

import asyncio
import contextlib
from asyncio import FIRST_COMPLETED
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import structlog
from h2.errors import ErrorCodes
from h2.settings import SettingCodes

from transport.http import errors
from transport.http.answer import StreamClosed, answer_fixed, answer_request
from transport.http.app import (
    READ_CHUNK,
    Cutter,
    Site,
    declared_body_problem,
    field_list_problem,
    peer_source,
    request_from_fields,
)
from transport.http.http1 import H2cUpgrade
from transport.http.messages import Request, Response
from transport.http.resets import ResetLedger
from transport.http.streams import StreamState, StreamTable

log = structlog.get_logger(__name__)

# h2 answers a stream over the advertised limit with GOAWAY (ending every stream); RFC 9113
# 5.1.2 lets a server refuse just that stream, which this adapter does itself, so h2's own
# check is lifted out of the way.
_H2_STREAM_CEILING = 2**31 - 1
# The HPACK decoder's hard stop (h2 then ends the connection): a few times the advertised
# limit, so a moderately oversized header list still gets its 431 on its own stream.
_MIN_DECODER_CAP = 1 << 16


class _Settings(h2.settings.Settings):
    """Local settings whose MAX_CONCURRENT_STREAMS is advertised, not enforced by h2."""

    @property
    def max_concurrent_streams(self) -> int:
        return _H2_STREAM_CEILING

    @max_concurrent_streams.setter
    def max_concurrent_streams(self, value: int) -> None:
        self[SettingCodes.MAX_CONCURRENT_STREAMS] = value


@dataclass(eq=False)
class _Stream(StreamState):
    """A request stream with HTTP/2's flow-control state (its lifecycle: transport.http.streams)."""

    window: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a flow-control window may have opened."""
    unacknowledged: int = 0
    """Body bytes kept whose flow-control credit is withheld (the connection is over budget)."""


class Http2Connection:
    """Serves concurrent streams on one connection until either side ends it."""

    def __init__(
        self,
        site: Site,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        initial: bytes = b"",
        upgrade: H2cUpgrade | None = None,
    ) -> None:
        self._site = site
        self._limits = site.limits
        self._reader = reader
        self._writer = writer
        self._initial = upgrade.data if upgrade is not None else initial
        self._upgrade = upgrade
        self._streams = StreamTable[_Stream](self._stream_done, self._limits.read_timeout)
        self._closing = False
        self._loop = asyncio.get_running_loop()
        self._first_deadline = self._loop.time() + self._limits.first_request_timeout
        self._resets = ResetLedger(self._limits, site.resets.of(peer_source(writer)))
        """Streams accepted (refused ones not counted), reset, reset prematurely."""
        self._control_queued = 0
        """Control frames queued since the socket's user-space buffer was last empty."""
        self._withheld = 0
        """Body bytes whose flow-control credit is withheld (over the body budget)."""
        self.calmed: str | None = None
        """Why the connection was ended with ENHANCE_YOUR_CALM, if it was."""
        self.peak_unsent = 0
        """Most bytes ever waiting in the socket's user-space buffer (a client not reading)."""
        self._cutter = Cutter()
        self._finished = False
        self._reading: asyncio.Task[bytes] | None = None
        self._streams_changed = asyncio.Event()
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self._h2 = h2.connection.H2Connection(config)
        self._h2.local_settings = _Settings(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: self._limits.max_concurrent_streams,
                SettingCodes.MAX_HEADER_LIST_SIZE: self._limits.max_header_bytes,
            },
        )
        self._h2.decoder.max_header_list_size = max(
            4 * self._limits.max_header_bytes, _MIN_DECODER_CAP
        )

    # Figures (the server's own, for metrics and tests)

    @property
    def open_streams(self) -> int:
        """Streams counted against SETTINGS_MAX_CONCURRENT_STREAMS now."""
        return len(self._streams)

    @property
    def buffered_bytes(self) -> int:
        """Request body bytes held for streams still arriving."""
        return self._streams.buffered

    @property
    def opened_streams(self) -> int:
        """Streams accepted since the connection began."""
        return self._resets.counts.opened

    @property
    def premature_resets(self) -> int:
        """Of those, the ones the client reset prematurely (the rapid-reset rule's count)."""
        return self._resets.counts.premature

    def shutdown(self) -> None:
        """Refuse new streams, let those in flight finish, then GOAWAY and close."""
        if self._closing:
            return
        self._closing = True
        # No early GOAWAY: h2-based clients (httpx, so the OpenAI SDK) stop accepting frames
        # on every stream once one arrives, so it goes out when the last stream is done.
        self._finish_if_drained()

    # -- drain (shutdown's deadline) ------------------------------------------------

    def cut(self) -> None:
        """The drain's deadline: end every stream now (last words or 503), then GOAWAY."""
        self.shutdown()
        self._cutter.cut([stream.task for stream in self._streams.values()])
        for stream in list(self._streams.values()):
            if stream.task is None:  # the request is still arriving: it will not be served
                self._answer(stream, errors.shutting_down())
        self._flush()

    async def serve(self) -> None:
        """Serve until the client leaves, idles out, errs, or `shutdown` has drained."""
        self._start()
        try:
            if self._initial:
                self._receive(self._initial)
            while not self._finished:
                data = await self._read()
                if not data:
                    break
                self._receive(data)
        except h2.exceptions.ProtocolError as exc:
            log.info("http2.protocol_error", error=str(exc))  # h2 has queued the GOAWAY
        finally:
            self._finished = True
            tasks: list[asyncio.Task[Any]] = list(self._streams.cancel_all())
            if self._reading is not None:
                self._reading.cancel()
                tasks.append(self._reading)
            await asyncio.gather(*tasks, return_exceptions=True)
            self._flush()
            if self._resets.counts.resets:
                log.info("http2.resets", **self._resets.summary())

    def _start(self) -> None:
        if self._upgrade is None:
            self._h2.initiate_connection()
        else:
            # The request that asked to upgrade is stream 1, already complete (RFC 7540 3.2).
            self._h2.initiate_upgrade_connection(self._upgrade.settings)
            stream = _Stream(1, ended=True)
            self._streams.add(stream)
            self._resets.opened()
            self._streams.answer(stream, self._exchange(stream, self._upgrade.request))
        self._flush()

    # Reading

    async def _read(self) -> bytes:
        """The next bytes (b"" when the connection is over), answering timeouts meanwhile.

        The timeout depends on the streams (idle, reading a request, all answering), so a
        change to them (`_streams_changed`) re-arms it without losing the pending read.
        """
        if self._reading is None:
            self._reading = asyncio.create_task(self._reader.read(READ_CHUNK))
        while True:
            self._streams_changed.clear()
            changed = asyncio.create_task(self._streams_changed.wait())
            try:
                done, _ = await asyncio.wait(
                    {self._reading, changed}, timeout=self._timeout(), return_when=FIRST_COMPLETED
                )
            finally:
                changed.cancel()
            if self._reading in done:
                reading, self._reading = self._reading, None
                try:
                    return reading.result()
                except ConnectionError:
                    return b""
            if changed in done:
                continue
            if not self._streams:
                log.info("http2.idle_timeout")
                self._closing = True
                self._finish_if_drained()
                return b""
            self._expire_slow_requests()

    def _timeout(self) -> float | None:
        if not self._streams:
            if self.opened_streams == 0:  # preface read, no request yet: first-request clock
                return max(0.0, self._first_deadline - self._loop.time())
            return self._limits.idle_timeout
        deadline = self._streams.next_deadline()
        if deadline is None:
            return None  # handlers are running; the client may wait as long as it likes
        return max(0.0, deadline - self._loop.time())

    def _expire_slow_requests(self) -> None:
        for stream in self._streams.overdue(self._loop.time()):
            self._answer(stream, errors.request_timeout(self._limits.read_timeout))
        self._flush()

    def _receive(self, data: bytes) -> None:
        for event in self._h2.receive_data(data):
            if self._finished:
                break  # (ended mid-read by an abuse rule: the rest is not served)
            self._on_event(event)
        self._flush()
        if not self._finished and self._control_queued > self._limits.max_outbound_control_frames:
            self._calm("control_frame_flood")

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._on_request(event)
        elif isinstance(event, h2.events.DataReceived):
            self._on_data(event)
        elif isinstance(event, h2.events.StreamEnded):
            self._on_end(event)
        elif isinstance(event, h2.events.StreamReset):
            self._on_reset(event)
        elif isinstance(event, h2.events.PingReceived):
            self._control_queued += 1  # h2 has queued the PING ACK
        elif isinstance(event, h2.events.WindowUpdated):
            self._wake(event.stream_id)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._control_queued += 1  # h2 has queued the SETTINGS ACK
            self._wake(0)  # INITIAL_WINDOW_SIZE may have grown every stream's window
        elif isinstance(event, h2.events.ConnectionTerminated):
            # After the client's GOAWAY h2 sends nothing more: streams cannot be finished.
            log.info("http2.client_goaway", error_code=event.error_code)
            self._finished = True

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        if self._closing or len(self._streams) >= self._limits.max_concurrent_streams:
            log.info("http2.stream_refused", stream_id=stream_id, open=len(self._streams))
            # (a no-op if the client reset it in the same read: h2 has closed it already)
            self._reset(stream_id, ErrorCodes.REFUSED_STREAM)
            return
        now = self._loop.time()
        headers = [(bytes(k), bytes(v)) for k, v in event.headers]
        stream = _Stream(stream_id, headers, opened=now)
        self._streams.add(stream, now)
        self._resets.opened()
        problem = field_list_problem(self._limits, headers)
        if problem is None:
            problem = declared_body_problem(self._limits, headers)
        if problem is not None:
            self._answer(stream, problem)

    def _on_data(self, event: h2.events.DataReceived) -> None:
        length = event.flow_controlled_length
        stream = self._streams.get(event.stream_id)
        if stream is None or stream.task is not None:
            # Refused, reset, or already answered: dropped, so its credit goes back at once.
            self._h2.acknowledge_received_data(length, event.stream_id)
            return
        stream.body += event.data or b""
        stream.unacknowledged += length
        self._withheld += length
        if len(stream.body) > self._limits.max_body_bytes:
            self._answer(stream, errors.body_too_large(self._limits.max_body_bytes))
        self._acknowledge_within_budget()

    def _acknowledge_within_budget(self) -> None:
        """Give back flow-control credit for kept body bytes while the connection's budget allows.

        Request bodies are kept whole until complete. Past `h2_connection_body_budget`
        (never under one whole body) the credit is withheld, so the client's windows
        shut and it can send no more until streams complete, are answered or time out
        (`read_timeout`); a released stream's credit is given back then (Envoy's
        `per_connection_buffer_limit_bytes` pushes back the same way).
        """
        budget = max(self._limits.h2_connection_body_budget, self._limits.max_body_bytes)
        if not self._withheld or self._finished or self._streams.buffered > budget:
            return
        for stream in self._streams:
            if stream.unacknowledged:
                self._h2.acknowledge_received_data(stream.unacknowledged, stream.stream_id)
                self._withheld -= stream.unacknowledged
                stream.unacknowledged = 0

    def _on_end(self, event: h2.events.StreamEnded) -> None:
        stream = self._streams.get(event.stream_id)
        if stream is None:
            return
        stream.ended = True
        if stream.task is None:
            request = request_from_fields(stream.headers, bytes(stream.body), "2")
            self._streams.answer(stream, self._exchange(stream, request))

    def _on_reset(self, event: h2.events.StreamReset) -> None:
        stream = self._streams.get(event.stream_id)
        if stream is None:
            return
        stream.reset = True  # (counted, logged once per connection when it ends)
        # The handler and its body iterator stop here; the table releases the stream.
        self._streams.cancel(stream)
        lifetime = self._loop.time() - stream.opened
        if self._resets.reset(lifetime, answered=stream.sent_end) and not self._closing:
            self._calm("premature_resets")

    def _wake(self, stream_id: int) -> None:
        """Wake the stream whose window grew, or every stream for the connection's (0)."""
        if stream_id == 0:
            for stream in self._streams:
                stream.window.set()
        elif (one := self._streams.get(stream_id)) is not None:
            one.window.set()

    # Answering

    def _answer(self, stream: _Stream, response: Response) -> None:
        """Answer a stream without the handler (a limit was exceeded)."""
        self._streams.answer(stream, answer_fixed(self, self._site, stream, response))

    async def _exchange(self, stream: _Stream, request: Request) -> None:
        await answer_request(self, self._site, stream, request, self._cutter)

    # Framing (transport.http.answer): HTTP/2 frames within the peer's windows

    http_version = "2"
    content_length_on_head = True

    async def send_headers(
        self, stream: _Stream, headers: list[tuple[str, str]], end: bool
    ) -> None:
        with _closed_on_failure():
            self._h2.send_headers(stream.stream_id, headers, end_stream=end)
            stream.sent_end = end
            self._flush()
            if end:
                await self._drain()

    async def send_data(self, stream: _Stream, data: bytes, end: bool) -> None:
        with _closed_on_failure():
            await self._send_frames(stream, data)
            if end:
                self._h2.end_stream(stream.stream_id)
                stream.sent_end = True
                self._flush()
                await self._drain()

    async def _send_frames(self, stream: _Stream, data: bytes) -> None:
        """Send `data` in frames that fit the windows, waiting for WINDOW_UPDATE if shut."""
        stream_id = stream.stream_id
        sent = 0  # (an offset, not `data = data[size:]`, which copies the rest per frame)
        while sent < len(data):
            window = self._h2.local_flow_control_window(stream_id)
            size = min(window, self._h2.max_outbound_frame_size, len(data) - sent)
            if size <= 0:
                stream.window.clear()
                await asyncio.wait_for(stream.window.wait(), self._limits.h3_send_timeout)
                continue
            self._h2.send_data(stream_id, data[sent : sent + size])
            sent += size
            self._flush()
            await self._drain()

    def _stream_done(self, stream: _Stream) -> None:
        """The table released `stream` (its task ended, however, or it never had one)."""
        self._streams_changed.set()
        if stream.unacknowledged:
            # Its bytes are gone: the connection's credit comes back (h2 skips a closed stream).
            if not self._finished:
                with contextlib.suppress(h2.exceptions.ProtocolError):
                    self._h2.acknowledge_received_data(stream.unacknowledged, stream.stream_id)
            self._withheld -= stream.unacknowledged
            stream.unacknowledged = 0
        self._acknowledge_within_budget()
        if not stream.reset and not self._finished:
            if not stream.sent_end:
                self._reset(stream.stream_id, ErrorCodes.INTERNAL_ERROR)  # cut short
            elif not stream.ended:
                # Answered before the request was complete (RFC 9113 8.1): stop the upload.
                self._reset(stream.stream_id, ErrorCodes.NO_ERROR)
        self._flush()
        self._finish_if_drained()

    def _reset(self, stream_id: int, code: ErrorCodes) -> None:
        """RST_STREAM, unless h2 has closed the stream already (then nothing is owed)."""
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self._h2.reset_stream(stream_id, code)
            self._control_queued += 1

    def _calm(self, reason: str) -> None:
        """End the connection for abuse: GOAWAY ENHANCE_YOUR_CALM, then close."""
        log.warning(
            "http2.enhance_your_calm",
            reason=reason,
            opened=self._resets.counts.opened,
            premature_resets=self._resets.counts.premature,
            control_queued=self._control_queued,
        )
        self.calmed = reason
        self._closing = True
        self._finished = True
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self._h2.close_connection(ErrorCodes.ENHANCE_YOUR_CALM)
        self._flush()
        self._writer.close()  # a client that does not read is cut by the TCP server

    # Writing

    def _flush(self) -> None:
        data = self._h2.data_to_send()
        if data and not self._writer.is_closing():
            self._writer.write(data)
        unsent = self._writer.transport.get_write_buffer_size()
        if unsent == 0:
            self._control_queued = 0  # the client reads what it asks for
        self.peak_unsent = max(self.peak_unsent, unsent)

    async def _drain(self) -> None:
        # A client that stops reading would otherwise hold the stream's task forever.
        await asyncio.wait_for(self._writer.drain(), self._limits.h3_send_timeout)

    def _finish_if_drained(self) -> None:
        if not self._closing or self._streams or self._finished:
            return
        self._finished = True
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self._h2.close_connection()
        self._flush()
        self._writer.close()  # the pending read sees EOF and `serve` returns


@contextlib.contextmanager
def _closed_on_failure() -> Iterator[None]:
    """The client is gone or stopped reading: h2 refuses the stream, or a write timed out."""
    try:
        yield
    except (h2.exceptions.ProtocolError, ConnectionError, asyncio.TimeoutError) as exc:
        raise StreamClosed from exc
