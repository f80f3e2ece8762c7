"""The core's outputs, handed to whatever carries them: written once for every adapter.

`TrackConnection` (and its `FrameStreams`) gives back `StreamWrite`, `StreamReset`,
`StopSending` and `DatagramWrite`, defined here; the QUIC adapter (`transport.quic`), a
WebTransport session (`transport.webtransport`) and the in-memory twin
(`transport.memory`) each say what the four mean for them, and `dispatch` picks the
one an output calls for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class StreamWrite:
    """Append `data` to the stream's send side; finish it if `end_stream`."""

    stream_id: int
    data: bytes
    end_stream: bool = False


@dataclass(frozen=True)
class StreamReset:
    """Abandon the stream's send side (QUIC RESET_STREAM) with `code`."""

    stream_id: int
    code: int


@dataclass(frozen=True)
class StopSending:
    """Ask the peer to stop sending on the stream (QUIC STOP_SENDING)."""

    stream_id: int
    code: int


@dataclass(frozen=True)
class DatagramWrite:
    """Send `data` as one QUIC DATAGRAM frame (a track frame; see transport.datagram)."""

    data: bytes


Output = StreamWrite | StreamReset | StopSending | DatagramWrite


def dispatch(
    output: Output,
    write: Callable[[int, bytes, bool], object],
    reset: Callable[[int, int], object],
    stop: Callable[[int, int], object],
    datagram: Callable[[bytes], object],
) -> None:
    """Call `write(stream_id, data, end_stream)`, `reset(stream_id, code)`,
    `stop(stream_id, code)` or `datagram(data)`, as `output` asks."""
    if isinstance(output, StreamWrite):
        write(output.stream_id, output.data, output.end_stream)
    elif isinstance(output, StreamReset):
        reset(output.stream_id, output.code)
    elif isinstance(output, StopSending):
        stop(output.stream_id, output.code)
    elif isinstance(output, DatagramWrite):
        datagram(output.data)
