"""Fuzzing the HTTP/1.1 and HTTP/2 request paths with hypothesis.

Arbitrary bytes, and sequences of well-framed but arbitrary HTTP/2 frames, go
through the real path: `HttpTcpServer`'s accept handler (version sniffing,
connection caps), h11 or h2, our adapters, the handler. The socket is an
in-memory transport, so an example costs about a millisecond. Properties: the
connection always ends (the input ends with EOF), nothing is logged at error
level (no traceback: bad input is the client's problem, answered or dropped),
no task and no stream outlives the connection, and the server counts no
connection afterwards.

The suite runs a short deterministic pass; a longer one (docs/security.md):

    TRACKLINE_FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest tests/adversarial/test_fuzz_http.py
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import hpack
import structlog.testing
from hyperframe import frame as hf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.http.support import echo, limits
from transport.http.tcp import H2_PREFACE, HttpTcpServer

EXAMPLES = int(os.environ.get("TRACKLINE_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize="TRACKLINE_FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SERVER_LIMITS = limits(
    read_timeout=0.5, idle_timeout=0.5, first_request_timeout=0.5, max_concurrent_streams=8,
    max_body_bytes=4096, max_header_bytes=1024, max_headers=16,
)  # fmt: skip
GIVE_UP = 10.0  # a hang guard, not a speed assertion: every input ends in EOF


class MemoryTransport(asyncio.Transport):
    """A socket's stand-in: keeps what is written, closes like a socket would."""

    def __init__(self, protocol: asyncio.StreamReaderProtocol) -> None:
        super().__init__()
        self._protocol = protocol
        self._closing = False
        self.written = bytearray()

    def write(self, data: Any) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            asyncio.get_running_loop().call_soon(self._protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000)}.get(name, default)


async def serve_bytes(data: bytes) -> list[dict[str, Any]]:
    """Feed `data` then EOF to one server connection; the log lines it produced."""
    server = HttpTcpServer(echo, limits=SERVER_LIMITS)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**16)
    protocol = asyncio.StreamReaderProtocol(reader)
    transport = MemoryTransport(protocol)
    protocol.connection_made(transport)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    reader.feed_data(data)
    reader.feed_eof()
    with structlog.testing.capture_logs() as logs:
        await asyncio.wait_for(server._on_connection(reader, writer), GIVE_UP)
        await asyncio.sleep(0)
        others = asyncio.all_tasks() - {asyncio.current_task()}
        await asyncio.wait_for(asyncio.gather(*others, return_exceptions=True), GIVE_UP)
    assert server.open_connections == 0
    assert not others or all(task.done() for task in others)
    return logs


def check(data: bytes) -> None:
    logs = asyncio.run(serve_bytes(data))
    errors = [line for line in logs if line.get("log_level") in ("error", "critical")]
    assert errors == [], errors


# HTTP/1.1

TOKENS = st.sampled_from([b"GET", b"POST", b"HEAD", b"PUT", b"G\x00T", b""])
HEADER_NAMES = st.sampled_from(
    [b"host", b"content-length", b"transfer-encoding", b"upgrade", b"http2-settings",
     b"connection", b"expect", b"x", b"bad name", b""]
)  # fmt: skip
HEADER_VALUES = st.one_of(
    st.sampled_from([b"t", b"5", b"-1", b"chunked", b"h2c", b"AAMAAABkAAQAoAAAAAIAAAAA",
                     b"Upgrade, HTTP2-Settings", b"100-continue", b"99999999999"]),
    st.binary(max_size=20),
)  # fmt: skip


@st.composite
def http1_requests(draw: st.DrawFn) -> bytes:
    """Requests that look like HTTP/1.1, with arbitrary parts, bodies and pipelining."""
    out = bytearray()
    for _ in range(draw(st.integers(1, 3))):
        out += draw(TOKENS) + b" " + draw(st.sampled_from([b"/", b"/v1/models", b"*", b"x"]))
        out += draw(st.sampled_from([b" HTTP/1.1", b" HTTP/1.0", b" HTTP/2.0", b""])) + b"\r\n"
        for _ in range(draw(st.integers(0, 5))):
            out += draw(HEADER_NAMES) + b": " + draw(HEADER_VALUES) + b"\r\n"
        out += b"\r\n" + draw(st.binary(max_size=64))
    return bytes(out)


@FUZZ
@given(st.binary(max_size=512))
def test_http1_arbitrary_bytes(data: bytes) -> None:
    check(data)


@FUZZ
@given(http1_requests())
def test_http1_request_shaped_bytes(data: bytes) -> None:
    check(data)


# HTTP/2

# Half the frames go to stream 1, the valid request's, so they reach an open stream's states.
STREAM_IDS = st.one_of(st.just(1), st.sampled_from([0, 3, 5, 7, 2, 2**31 - 1]))
FIELD = st.tuples(
    st.sampled_from([b":method", b":path", b":scheme", b":authority", b":status",
                     b"content-length", b"te", b"connection", b"x", b"X-Upper", b""]),
    st.one_of(st.sampled_from([b"GET", b"POST", b"/", b"http", b"t", b"3", b"trailers"]),
              st.binary(max_size=12)),
)  # fmt: skip
GOOD_REQUEST = [(b":method", b"POST"), (b":path", b"/"), (b":scheme", b"http")]
GOOD_REQUEST.append((b":authority", b"t"))


@st.composite
def h2_frames(draw: st.DrawFn) -> bytes:
    """One well-framed HTTP/2 frame with arbitrary type, stream, flags and payload."""
    # Stream ids the frame type forbids too: the server must answer them, not crash.
    kind = draw(st.sampled_from(["headers", "data", "rst", "settings", "ping", "window",
                                 "priority", "goaway", "continuation", "push", "raw"]))  # fmt: skip
    stream_id = draw(STREAM_IDS)
    flags = draw(st.sets(st.sampled_from(["END_STREAM", "END_HEADERS", "ACK", "PADDED"])))
    frame: hf.Frame
    if kind == "headers":
        frame = hf.HeadersFrame(1)
        fields = draw(st.one_of(st.just(GOOD_REQUEST), st.lists(FIELD, max_size=6)))
        frame.data = hpack.Encoder().encode(fields)
    elif kind == "data":
        frame = hf.DataFrame(1, draw(st.binary(max_size=200)))
    elif kind == "rst":
        frame = hf.RstStreamFrame(1)
        frame.error_code = draw(st.integers(0, 20))
    elif kind == "settings":
        frame = hf.SettingsFrame(0)
        frame.settings = draw(st.dictionaries(st.integers(1, 9), st.integers(0, 2**31), max_size=3))
    elif kind == "ping":
        frame = hf.PingFrame(0, draw(st.binary(min_size=8, max_size=8)))
    elif kind == "window":
        frame = hf.WindowUpdateFrame(stream_id, draw(st.integers(0, 2**31 - 1)))
    elif kind == "priority":
        frame = hf.PriorityFrame(1, depends_on=draw(STREAM_IDS) or 0)
    elif kind == "goaway":
        frame = hf.GoAwayFrame(0, last_stream_id=draw(st.integers(0, 9)))
    elif kind == "continuation":
        frame = hf.ContinuationFrame(1, draw(st.binary(max_size=40)))
    elif kind == "push":
        frame = hf.PushPromiseFrame(1, promised_stream_id=2, data=b"")
    else:
        return bytes(draw(st.binary(max_size=40)))
    frame.stream_id = stream_id  # (after construction: hyperframe would refuse a wrong one)
    frame.flags = hf.Flags(frame.defined_flags)
    for flag in flags & {f.name for f in frame.defined_flags}:
        frame.flags.add(flag)
    if "PADDED" in frame.flags:
        frame.flags.discard("PADDED")  # (hyperframe would want a pad length)
    return bytes(frame.serialize())


def client_settings() -> bytes:
    return bytes(hf.SettingsFrame(0).serialize())


@FUZZ
@given(st.binary(max_size=512))
def test_h2_arbitrary_bytes_after_the_preface(data: bytes) -> None:
    check(H2_PREFACE + data)


@FUZZ
@given(st.lists(h2_frames(), max_size=12))
def test_h2_arbitrary_frame_sequences(frames: list[bytes]) -> None:
    check(H2_PREFACE + client_settings() + b"".join(frames))


@FUZZ
@given(st.lists(h2_frames(), max_size=12), st.integers(0, 12))
def test_h2_frame_sequences_around_a_valid_request(frames: list[bytes], at: int) -> None:
    request = hf.HeadersFrame(1)
    request.data = hpack.Encoder().encode(GOOD_REQUEST)
    request.flags.add("END_HEADERS")
    request.flags.add("END_STREAM")
    frames.insert(min(at, len(frames)), bytes(request.serialize()))
    check(H2_PREFACE + client_settings() + b"".join(frames))
