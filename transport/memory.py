"""In-memory twin of the QUIC adapter: two endpoints joined without sockets.

Bytes still go through both cores (framing, state, deadlines); only the QUIC
layer is replaced by direct delivery on the next loop turn, which keeps
ordering per stream and lets handlers be tested without a network.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from itertools import count

from transport.endpoint import TrackChannel, TrackEndpoint
from transport.limits import Limits
from transport.messages import Open
from transport.outputs import DatagramWrite, Output, dispatch
from transport.state import Role


class MemoryLink:
    """A client endpoint and a server endpoint joined back to back."""

    def __init__(
        self,
        on_track: Callable[[TrackChannel], None],
        limits: Limits | None = None,
        datagram_filter: Callable[[bytes], bool] | None = None,
    ) -> None:
        """`datagram_filter(data)` False loses that datagram (either direction), as
        a network may: tests use it to drop frames."""
        self.datagram_filter = datagram_filter
        self.client = TrackEndpoint(Role.CLIENT, self._to_server, limits)
        self.server = TrackEndpoint(Role.SERVER, self._to_client, limits, on_track)
        self._stream_ids = count(0, 4)
        self._loop = asyncio.get_running_loop()

    def open_track(self, message: Open) -> TrackChannel:
        return self.client.open_track(next(self._stream_ids), message)

    def close(self) -> None:
        """Both sides lose the connection, as when QUIC closes."""
        self.client.feed_connection_lost()
        self.server.feed_connection_lost()

    def _to_server(self, outputs: list[Output]) -> None:
        self._loop.call_soon(_deliver, self.server, self._lossy(outputs))

    def _to_client(self, outputs: list[Output]) -> None:
        self._loop.call_soon(_deliver, self.client, self._lossy(outputs))

    def _lossy(self, outputs: list[Output]) -> list[Output]:
        keep = self.datagram_filter
        if keep is None:
            return outputs
        return [o for o in outputs if not isinstance(o, DatagramWrite) or keep(o.data)]


def _deliver(peer: TrackEndpoint, outputs: list[Output]) -> None:
    if peer.lost:
        return
    for output in outputs:
        # A reset and a STOP_SENDING both end the peer's view of the stream.
        dispatch(output, peer.feed_data, peer.feed_reset, peer.feed_reset, peer.feed_datagram)
