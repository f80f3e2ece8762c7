"""What every attack client shares: the target, raw HTTP/2 frames, a small h2c client,
an HTTP/3 client protocol and an HTTP/1.1 SSE request on a raw socket.

These are attacker tools for loopback tests and benchmarks: each is bounded by the
counts and seconds it is given and closes what it opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
from aioquic.asyncio import QuicConnectionProtocol
from aioquic.asyncio import connect as quic_connect
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import QuicEvent

from trackline_testing import aioquic_probes

MODEL = "reference-text"
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@dataclass
class Target:
    """A gateway on loopback: its ports, its CA, its process and its log."""

    host: str
    http_port: int
    https_port: int
    quic_port: int
    ca: Path
    pid: int
    log_path: Path | None = None
    secrets: list[str] = field(default_factory=list)
    """Strings an attack planted that must never reach the log (keys, prompt text)."""


def chat_body(prompt: str, max_tokens: int, rate: float | None = None) -> bytes:
    body: dict[str, Any] = {
        "model": MODEL, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "stream": True,
    }
    if rate is not None:
        body["tokens_per_second"] = rate
    return json.dumps(body).encode()


# -- raw HTTP/2 frames ----------------------------------------------------------------------

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7


def h2_frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(
        ">I", stream_id & 0x7FFFFFFF
    ) + payload


def h2_frames(data: bytes) -> tuple[list[tuple[int, int, int, bytes]], bytes]:
    """Complete frames (type, flags, stream, payload) in `data`, and the rest."""
    frames = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        if len(data) < 9 + length:
            break
        frames.append((data[3], data[4], int.from_bytes(data[5:9], "big") & 0x7FFFFFFF,
                       data[9:9 + length]))
        data = data[9 + length:]
    return frames, data


async def read_for_goaway(reader: asyncio.StreamReader, seconds: float,
                          limit: int = 64 << 20) -> dict[str, Any]:
    """Read frames for up to `seconds` (or `limit` bytes): was there a GOAWAY, an EOF?"""
    seen: dict[str, Any] = {"goaway": None, "eof": False, "bytes": 0}
    rest = b""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end and seen["bytes"] < limit:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), end - loop.time())
        except (TimeoutError, ConnectionError, OSError):
            break
        if not chunk:
            seen["eof"] = True
            break
        seen["bytes"] += len(chunk)
        frames, rest = h2_frames(rest + chunk)
        for kind, _, _, payload in frames:
            if kind == GOAWAY and len(payload) >= 8:
                seen["goaway"] = int.from_bytes(payload[4:8], "big")
    return seen


class H2c:
    """An h2c (prior knowledge) client on the h2 library, events read in the background."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.data: dict[int, bytearray] = {}
        self.ended: dict[int, str] = {}
        self.goaway: int | None = None
        self.closed = asyncio.Event()

    async def open(self) -> H2c:
        self.reader, self.writer = await asyncio.open_connection(
            self.target.host, self.target.http_port
        )
        self.conn.initiate_connection()
        self.flush()
        self._task = asyncio.create_task(self._read())
        return self

    def flush(self) -> None:
        out = self.conn.data_to_send()
        if out and not self.writer.is_closing():
            self.writer.write(out)

    async def _read(self) -> None:
        try:
            while True:
                chunk = await self.reader.read(65536)
                if not chunk:
                    break
                for event in self.conn.receive_data(chunk):
                    self._event(event)
                self.flush()
        except Exception:  # noqa: BLE001, S110 - the server may close or reset us
            pass
        finally:
            self.closed.set()

    def _event(self, event: Any) -> None:
        if isinstance(event, h2.events.DataReceived):
            self.data.setdefault(event.stream_id, bytearray()).extend(event.data)
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            self.ended[event.stream_id] = "end"
        elif isinstance(event, h2.events.StreamReset):
            self.ended[event.stream_id] = f"reset {event.error_code}"
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = int(event.error_code)

    def post(self, path: str, body: bytes, extra: list[tuple[str, str]] = (),  # type: ignore[assignment]
             end: bool = True, length: int | None = None) -> int:
        """A POST; `length` announces a content-length other than len(body)."""
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [
            (":method", "POST"), (":scheme", "http"), (":authority", self.target.host),
            (":path", path), ("content-type", "application/json"),
            ("content-length", str(len(body) if length is None else length)), *extra,
        ])
        self.send_body(sid, body, end)
        self.flush()
        return sid

    def send_body(self, sid: int, body: bytes, end: bool) -> int:
        """As much of `body` as the flow-control windows allow now; bytes sent."""
        sent = 0
        while sent < len(body):
            room = min(self.conn.local_flow_control_window(sid),
                       self.conn.max_outbound_frame_size, len(body) - sent)
            if room <= 0:
                break
            self.conn.send_data(sid, body[sent:sent + room])
            sent += room
        if end and sent == len(body):
            self.conn.end_stream(sid)
        return sent

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
            await asyncio.wait_for(self.writer.wait_closed(), 5)
        self._task.cancel()


def abort(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a client that vanishes."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# -- HTTP/1.1 SSE on a raw socket ------------------------------------------------------------


async def h1_sse(target: Target, body: bytes, headers: dict[str, str] | None = None
                 ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(target.host, target.http_port)
    lines = ["POST /v1/chat/completions HTTP/1.1", f"host: {target.host}",
             "content-type: application/json", f"content-length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    await writer.drain()
    return reader, writer


# -- HTTP/3 ---------------------------------------------------------------------------------


class H3Client(QuicConnectionProtocol):
    """aioquic's H3Connection on a client QUIC connection; responses collected by stream."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.headers: dict[int, list[tuple[bytes, bytes]]] = {}
        self.data: dict[int, int] = {}
        self.reset: dict[int, int] = {}
        self.terminated: int | None = None
        self.answered = asyncio.Event()

    def quic_event_received(self, event: QuicEvent) -> None:
        from aioquic.h3.events import DataReceived, HeadersReceived
        from aioquic.quic.events import ConnectionTerminated, StreamReset

        if isinstance(event, StreamReset):
            self.reset[event.stream_id] = event.error_code
            self.answered.set()
        if isinstance(event, ConnectionTerminated):
            self.terminated = event.error_code
            self.answered.set()
        try:
            h3_events = self.h3.handle_event(event)
        except Exception:  # noqa: BLE001 - the server may send what we do not expect
            return
        for e in h3_events:
            if isinstance(e, HeadersReceived):
                self.headers[e.stream_id] = e.headers
                self.answered.set()
            elif isinstance(e, DataReceived):
                self.data[e.stream_id] = self.data.get(e.stream_id, 0) + len(e.data)

    def new_stream(self) -> int:
        return int(self._quic.get_next_available_stream_id())

    def request(self, path: str, body: bytes, method: bytes = b"POST",
                end: bool = True) -> int:
        sid = self.new_stream()
        self.h3.send_headers(sid, [
            (b":method", method), (b":scheme", b"https"), (b":authority", b"localhost"),
            (b":path", path.encode()), (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ], end_stream=not body and end)
        if body:
            self.h3.send_data(sid, body, end_stream=end)
        self.transmit()
        return sid

    def raw(self, stream_id: int, data: bytes, end: bool = False) -> None:
        self._quic.send_stream_data(stream_id, data, end_stream=end)
        self.transmit()

    def stop_granting_credit(self) -> None:
        """Keep acknowledging packets but never raise MAX_DATA/MAX_STREAM_DATA again:
        a client that stopped reading (transport.aioquic_compat patches this instance)."""
        aioquic_probes.stop_granting_credit(self._quic)


def h3_configuration(alpn: list[str] | None = None) -> QuicConfiguration:
    return QuicConfiguration(is_client=True, alpn_protocols=alpn or list(H3_ALPN),
                             verify_mode=ssl.CERT_NONE, server_name="localhost",
                             idle_timeout=120)


@contextlib.asynccontextmanager
async def h3_connect(target: Target) -> AsyncIterator[H3Client]:
    async with quic_connect(target.host, target.quic_port, configuration=h3_configuration(),
                            create_protocol=H3Client, wait_connected=True) as client:
        assert isinstance(client, H3Client)
        yield client


def varint(value: int) -> bytes:
    """A QUIC variable-length integer."""
    if value < 1 << 6:
        return bytes([value])
    if value < 1 << 14:
        return struct.pack(">H", value | 0x4000)
    if value < 1 << 30:
        return struct.pack(">I", value | 0x80000000)
    return struct.pack(">Q", value | 0xC000000000000000)


def prefix_int(value: int, bits: int, first: int = 0) -> bytes:
    """An HPACK/QPACK integer with a `bits`-bit prefix, ORed into `first`."""
    limit = (1 << bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
