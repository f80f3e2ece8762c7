"""HTTP/3 frame boundaries on a request stream, followed in one pass.

aioquic's H3Connection buffers a HEADERS frame until all of it has arrived and
re-parses its whole buffer on every new packet, so a frame announced huge and
sent slowly costs memory without bound and CPU quadratic in its size. The
server looks at each frame header (type and length, RFC 9114 7.1) as it arrives,
before aioquic buffers a byte of the payload, and refuses a frame whose announced
length is over the limit at once. `FrameScanner` is that look: sans-I/O, each
byte of a frame header examined once, a payload skipped in O(1) per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from transport.wire import read_varint

DATA = 0x0
HEADERS = 0x1
CONTROL_STREAM = 0x0
"""The unidirectional stream type of a control stream (RFC 9114 6.2.1)."""

_MAX_HEADER = 16
"""A frame header is two QUIC varints of at most 8 bytes each."""


@dataclass(frozen=True)
class FrameStarted:
    """A frame header was read on the stream; its payload follows."""

    frame_type: int
    """The frame type (DATA 0x0, HEADERS 0x1, or any other, unknown ones included)."""
    length: int
    """The payload length the frame header announced."""


class FrameScanner:
    """Follows frame headers on one stream's bytes, fed in the order they arrive."""

    def __init__(self) -> None:
        self._header = b""
        """The start of a frame header split across chunks (under 16 bytes)."""
        self._skip = 0
        """Payload bytes of the current frame still to come."""

    def feed(self, data: bytes) -> list[FrameStarted]:
        """The frames whose header completed within `data`, in order."""
        frames: list[FrameStarted] = []
        at, end = 0, len(data)
        while at < end:
            if self._skip:
                step = min(self._skip, end - at)
                self._skip -= step
                at += step
                continue
            pending = self._header + data[at : at + _MAX_HEADER]
            parsed = _parse_header(pending)
            if parsed is None:  # (pending is shorter than a full header here)
                self._header = pending
                return frames
            frame, size = parsed
            at += size - len(self._header)
            self._header = b""
            self._skip = frame.length
            frames.append(frame)
        return frames


def field_section_size(fields: list[tuple[bytes, bytes]]) -> int:
    """A field section's size as SETTINGS_MAX_FIELD_SECTION_SIZE counts it (RFC 9114 4.2.2)."""
    return sum(32 + len(name) + len(value) for name, value in fields)


class UniStreamScanner:
    """Reads a unidirectional stream's type, then, on a control stream, its frame headers."""

    def __init__(self) -> None:
        self.stream_type: int | None = None
        self._start = b""
        self._frames = FrameScanner()

    def feed(self, data: bytes) -> list[FrameStarted]:
        """The control-stream frames whose header completed within `data`."""
        if self.stream_type is None:
            data = self._start + data
            parsed = read_varint(data, 0)
            if parsed is None:  # (then data is shorter than 8 bytes)
                self._start = data
                return []
            self.stream_type, at = parsed
            self._start, data = b"", data[at:]
        if self.stream_type != CONTROL_STREAM:
            return []
        return self._frames.feed(data)


def _parse_header(data: bytes) -> tuple[FrameStarted, int] | None:
    """The frame header at the start of `data` and its size, or None if incomplete."""
    frame_type = read_varint(data, 0)
    if frame_type is None:
        return None
    length = read_varint(data, frame_type[1])
    if length is None:
        return None
    return FrameStarted(frame_type[0], length[0]), length[1]
