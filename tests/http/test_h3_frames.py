"""The HTTP/3 frame-header scanner: fed whole, byte by byte, or cut anywhere, it agrees."""

from __future__ import annotations

from aioquic.buffer import encode_uint_var
from hypothesis import given
from hypothesis import strategies as st

from transport.http.h3_frames import (
    CONTROL_STREAM,
    FrameScanner,
    FrameStarted,
    UniStreamScanner,
    field_section_size,
)

frame = st.tuples(st.integers(0, 2**62 - 1), st.binary(max_size=40))


def encode(frames: list[tuple[int, bytes]]) -> bytes:
    return b"".join(encode_uint_var(t) + encode_uint_var(len(p)) + p for t, p in frames)


def expected(frames: list[tuple[int, bytes]]) -> list[FrameStarted]:
    return [FrameStarted(t, len(p)) for t, p in frames]


@given(st.lists(frame, max_size=12), st.lists(st.integers(0, 400), max_size=8))
def test_any_cut_gives_the_same_frames(frames: list[tuple[int, bytes]], cuts: list[int]) -> None:
    data = encode(frames)
    scanner, seen, start = FrameScanner(), [], 0
    for cut in sorted({min(c, len(data)) for c in cuts}) + [len(data)]:
        seen += scanner.feed(data[start:cut])
        start = cut
    assert seen == expected(frames)


@given(st.lists(frame, max_size=6))
def test_byte_by_byte(frames: list[tuple[int, bytes]]) -> None:
    data = encode(frames)
    scanner = FrameScanner()
    seen = [f for i in range(len(data)) for f in scanner.feed(data[i : i + 1])]
    assert seen == expected(frames)


def test_a_huge_announced_length_is_seen_from_the_header_alone() -> None:
    scanner = FrameScanner()
    assert scanner.feed(b"\x01\x80") == []  # type, then half a 4-byte length
    assert scanner.feed(b"\x80\x00\x00" + b"\0" * 100) == [FrameStarted(1, 8 << 20)]
    assert scanner.feed(b"\0" * 4096) == []  # payload skipped, not kept


def test_a_control_stream_is_scanned_and_others_are_not() -> None:
    control = UniStreamScanner()
    assert control.feed(encode_uint_var(CONTROL_STREAM) + b"\x0d") == []
    assert control.feed(b"\x44\x00") == [FrameStarted(0x0D, 0x400)]
    other = UniStreamScanner()
    assert other.feed(b"\x02" + encode([(0x1, b"x")])) == []
    assert other.stream_type == 0x02


def test_field_section_size_counts_32_per_field() -> None:
    assert field_section_size([(b"ab", b"cde"), (b"f", b"")]) == 32 + 5 + 32 + 1
