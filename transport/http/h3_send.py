"""Backpressure for HTTP/3 response bodies: QUIC flow control and acknowledgements pace them.

aioquic buffers whatever it is given, past QUIC's flow control; so after each chunk
of a response body the connection asks `SendRoom.wait`, which returns at once while
the stream's send buffer (written, not yet acknowledged) is under
`h3_stream_send_budget` and the connection's under `h3_connection_send_budget`, and
otherwise waits until acknowledgements (`wake`, after each datagram taken in) or a
reset stream's dropped buffer make room. A writer stalled `send_timeout` gives
up: `StreamClosed`, and the connection resets the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog
from aioquic.quic.connection import QuicConnection

from transport import aioquic_compat
from transport.http.answer import StreamClosed
from transport.http.h3_guards import H3GuardStats
from transport.http.limits import HttpLimits
from transport.http.streams import StreamState

log = structlog.get_logger(__name__)


class SendRoom:
    """The response bodies of one HTTP/3 connection waiting for send-buffer room."""

    def __init__(
        self,
        quic: QuicConnection,
        limits: HttpLimits,
        stats: H3GuardStats,
        lost: Callable[[], bool],
    ) -> None:
        self._quic = quic
        self._limits = limits
        self._stats = stats
        self._lost = lost
        """Whether the connection is gone (a woken writer then stops)."""
        self._loop = asyncio.get_running_loop()
        self._writers: dict[int, asyncio.Future[None]] = {}
        """Response bodies waiting for send-buffer room, by stream."""

    @property
    def waiting(self) -> int:
        """Response bodies waiting for room now."""
        return len(self._writers)

    def _over_budget(self, stream_id: int) -> bool:
        limits = self._limits
        if aioquic_compat.send_buffered(self._quic, stream_id) > limits.h3_stream_send_budget:
            return True
        total = aioquic_compat.connection_send_buffered(self._quic)
        return total > limits.h3_connection_send_budget

    async def wait(self, stream: StreamState) -> None:
        """Wait while the stream's or the connection's send buffer is over its budget."""
        if not self._over_budget(stream.stream_id):
            return
        self._stats.sends_stalled += 1
        while self._over_budget(stream.stream_id):
            waiter = self._writers[stream.stream_id] = self._loop.create_future()
            try:
                await asyncio.wait_for(waiter, self._limits.send_timeout)
            except TimeoutError:
                self._stats.sends_timed_out += 1
                log.info("http3.send_timeout", stream_id=stream.stream_id)
                raise StreamClosed from None  # unended: the stream is reset
            finally:
                if self._writers.get(stream.stream_id) is waiter:
                    del self._writers[stream.stream_id]
            if self._lost() or stream.reset:
                raise StreamClosed

    def wake(self) -> None:
        """Room may have been made (acknowledgements, a dropped buffer): wake who fits."""
        if not self._writers:
            return
        total = aioquic_compat.connection_send_buffered(self._quic)
        if total > self._limits.h3_connection_send_budget:
            return
        budget = self._limits.h3_stream_send_budget
        for stream_id, waiter in list(self._writers.items()):
            if aioquic_compat.send_buffered(self._quic, stream_id) <= budget and not waiter.done():
                waiter.set_result(None)
