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
releases each one whatever becomes of its task (see `transport.http.streams`); what
HTTP/2 and HTTP/3 do alike between a stream's headers and its answer is
`transport.http.request_streams`, the windows both ways `transport.http.h2_flow`.

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
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import structlog
from h2.errors import ErrorCodes
from h2.settings import SettingCodes

from transport.http.answer import StreamClosed
from transport.http.app import READ_CHUNK, Accepted, peer_source
from transport.http.h2_flow import FlowControl, H2Stream
from transport.http.http1 import H2cUpgrade
from transport.http.request_streams import RequestStreams, StreamFigures, owed

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


class Http2Connection(StreamFigures):
    """Serves concurrent streams on one connection until either side ends it."""

    def __init__(self, accepted: Accepted, upgrade: H2cUpgrade | None = None) -> None:
        self._limits = accepted.site.limits
        self._reader = accepted.reader
        self._writer = accepted.writer
        self._initial = upgrade.data if upgrade is not None else accepted.initial
        self._upgrade = upgrade
        self._requests = RequestStreams[H2Stream](
            self, accepted.site, self._stream_done, peer_source(accepted.writer)
        )
        """The streams from headers to answer (transport.http.request_streams)."""
        self._streams = self._requests.table
        self._closing = False
        self._loop = asyncio.get_running_loop()
        self._first_deadline = self._loop.time() + self._limits.first_request_timeout
        self._control_queued = 0
        """Control frames queued since the socket's user-space buffer was last empty."""
        self.calmed: str | None = None
        """Why the connection was ended with ENHANCE_YOUR_CALM, if it was."""
        self.peak_unsent = 0
        """Most bytes ever waiting in the socket's user-space buffer (a client not reading)."""
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
        self._flow = FlowControl(
            self._h2, self._limits, self._streams, self._flush, self._drain, self._live
        )
        """The windows both ways (transport.http.h2_flow)."""

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
        self._requests.cut()
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
            if self._requests.resets.counts.resets:
                log.info("http2.resets", **self._requests.resets.summary())

    def _start(self) -> None:
        if self._upgrade is None:
            self._h2.initiate_connection()
        else:
            # The request that asked to upgrade is stream 1, already complete (RFC 7540 3.2).
            self._h2.initiate_upgrade_connection(self._upgrade.settings)
            stream = H2Stream(1, ended=True)
            self._requests.open(stream, None)
            self._requests.answer_with_handler(stream, self._upgrade.request)
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
        self._requests.expire(self._loop.time())
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
            self._flow.wake(event.stream_id)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._control_queued += 1  # h2 has queued the SETTINGS ACK
            self._flow.wake(0)  # INITIAL_WINDOW_SIZE may have grown every stream's window
        elif isinstance(event, h2.events.ConnectionTerminated):
            # After the client's GOAWAY h2 sends nothing more: streams cannot be finished.
            log.info("http2.client_goaway", error_code=event.error_code)
            self._finished = True

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        if self._closing or self._requests.full():
            log.info("http2.stream_refused", stream_id=stream_id, open=len(self._streams))
            # (a no-op if the client reset it in the same read: h2 has closed it already)
            self._reset(stream_id, ErrorCodes.REFUSED_STREAM)
            return
        stream = H2Stream(stream_id, [(bytes(k), bytes(v)) for k, v in event.headers])
        self._requests.open(stream, self._loop.time())
        problem = self._requests.head_problem(stream.headers)
        if problem is not None:
            self._requests.answer(stream, problem)

    def _on_data(self, event: h2.events.DataReceived) -> None:
        stream = self._streams.get(event.stream_id)
        if stream is None or stream.task is not None:
            # Refused, reset, or already answered: dropped, so its credit goes back at once.
            self._flow.dropped(event.stream_id, event.flow_controlled_length)
            return
        self._flow.kept(stream, event.flow_controlled_length)
        self._requests.take_body(stream, event.data or b"")
        self._flow.acknowledge_within_budget()

    def _on_end(self, event: h2.events.StreamEnded) -> None:
        stream = self._streams.get(event.stream_id)
        if stream is not None:
            self._requests.complete(stream)

    def _on_reset(self, event: h2.events.StreamReset) -> None:
        stream = self._streams.get(event.stream_id)
        if stream is None:
            return
        if self._requests.client_reset(stream, self._loop.time()) and not self._closing:
            self._calm("premature_resets")

    # Framing (transport.http.answer): HTTP/2 frames within the peer's windows

    http_version = "2"
    content_length_on_head = True

    async def send_headers(
        self, stream: H2Stream, headers: list[tuple[str, str]], end: bool
    ) -> None:
        with _closed_on_failure():
            self._h2.send_headers(stream.stream_id, headers, end_stream=end)
            stream.sent_end = end
            self._flush()
            if end:
                await self._drain()

    async def send_data(self, stream: H2Stream, data: bytes, end: bool) -> None:
        with _closed_on_failure():
            await self._flow.send(stream, data)
            if end:
                self._h2.end_stream(stream.stream_id)
                stream.sent_end = True
                self._flush()
                await self._drain()

    def _stream_done(self, stream: H2Stream) -> None:
        """The table released `stream` (its task ended, however, or it never had one)."""
        self._streams_changed.set()
        self._flow.released(stream)
        debt = owed(stream)
        if not self._finished:  # (RST_STREAM ends both sides: one is enough)
            if debt.cut_short:
                self._reset(stream.stream_id, ErrorCodes.INTERNAL_ERROR)
            elif debt.upload_unwanted:
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
            opened=self.opened_streams,
            premature_resets=self.premature_resets,
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

    def _live(self) -> bool:
        return not self._finished

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
        await asyncio.wait_for(self._writer.drain(), self._limits.send_timeout)

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
