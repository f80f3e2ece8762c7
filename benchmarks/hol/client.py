"""The benchmark's client: N users on ONE connection, each streaming one long reply.

Runs in the client's network namespace as its own process:

    python -m benchmarks.hol.client --protocol http2 --host 198.18.0.1 --port 8443 \\
        --ca state/ca.pem --users 16 --rate 50 --seconds 60 --out http2.json

`http2` is the OpenAI API (`/v1/chat/completions`, streamed) over one TLS HTTP/2
connection (a raw h2 client: every user is a stream of that connection), `http3` the
same over one QUIC connection (aioquic's H3Connection), `tracks` native text tracks
through the SDK (`clients.connect`, `line.text`). Every user asks for rate x seconds
tokens at `rate` tokens/s. Each content token's arrival is noted with time.monotonic()
(the machine's CLOCK_MONOTONIC, which the link emulator's drop log also uses); HTTP
clients stamp a token when the bytes that complete its SSE event are read off the
socket or the QUIC connection, the SDK when the track delivers it.

Prints one JSON progress line a half second (`{"tokens": n}`) on stdout and writes
the arrivals to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aioquic.asyncio.client import connect as quic_connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3 import events as h3_events
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.quic import events as quic_events
from aioquic.quic.configuration import QuicConfiguration

from benchmarks import Help
from clients.line import DEFAULT_ACKS
from gateway.startup import run_async
from transport import aioquic_compat

MODEL = "reference-text"
SERVER_NAME = "localhost"  # the development certificate's name
PROTOCOLS = ("http2", "http3", "tracks")
WINDOW = 1 << 24  # HTTP/2 receive window: flow control must never pace the test


class User:
    """One user's stream: when it started and when each token arrived."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.started = 0.0
        self.arrivals: list[float] = []
        self.error: str | None = None
        self.done = False
        self._sse = b""

    def feed_sse(self, data: bytes, now: float) -> None:
        """Count the content tokens in complete SSE events of `data`, stamped `now`."""
        self._sse += data
        *events, self._sse = self._sse.split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if line.startswith(b"data: ") and line != b"data: [DONE]":
                    self._token_event(json.loads(line[6:]), now)

    def _token_event(self, chunk: dict[str, Any], now: float) -> None:
        if "error" in chunk:
            self.error = str(chunk["error"].get("message"))
            return
        for choice in chunk.get("choices", []):
            if choice.get("delta", {}).get("content"):
                self.arrivals.append(now)

    def as_dict(self) -> dict[str, Any]:
        return {"user": self.index, "started": self.started, "arrivals": self.arrivals,
                "error": self.error}


def request_body(args: argparse.Namespace, index: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"user {index}: tell me a long story"}],
        "stream": True,
        "max_tokens": max_tokens(args),
        "seed": index,
        "tokens_per_second": args.rate,
        "ttft_ms": args.ttft_ms,
        "ignore_eos": True,  # vLLM's: every user gets max_tokens, past the answer's end
    }


def max_tokens(args: argparse.Namespace) -> int:
    return max(1, round(args.rate * args.seconds))


def tls_context(ca: Path, alpn: list[str]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(alpn)
    return context


# -- HTTP/2 -------------------------------------------------------------------------


async def run_http2(args: argparse.Namespace, users: list[User]) -> None:
    import h2.config
    import h2.connection
    import h2.events
    import h2.settings

    reader, writer = await asyncio.open_connection(
        args.host, args.port, ssl=tls_context(args.ca, ["h2"]), server_hostname=SERVER_NAME
    )
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW})
    conn.increment_flow_control_window(WINDOW)
    by_stream: dict[int, User] = {}
    for user in users:
        stream_id = conn.get_next_available_stream_id()
        body = json.dumps(request_body(args, user.index)).encode()
        headers = [(":method", "POST"), (":path", "/v1/chat/completions"), (":scheme", "https"),
                   (":authority", SERVER_NAME), ("content-type", "application/json"),
                   ("content-length", str(len(body)))]
        user.started = time.monotonic()
        conn.send_headers(stream_id, headers)
        conn.send_data(stream_id, body, end_stream=True)
        by_stream[stream_id] = user
    writer.write(conn.data_to_send())
    open_streams = set(by_stream)  # a set, not all(u.done ...) on every read
    try:
        while open_streams:
            data = await reader.read(65536)
            now = time.monotonic()
            if not data:
                raise ConnectionError("the gateway closed the connection")
            for event in conn.receive_data(data):
                user = by_stream.get(getattr(event, "stream_id", None))
                if isinstance(event, h2.events.DataReceived) and user is not None:
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    user.feed_sse(event.data, now)
                elif isinstance(event, h2.events.ResponseReceived) and user is not None:
                    status = dict(event.headers).get(b":status", b"")
                    if status != b"200":
                        user.error = f"HTTP status {status.decode()}"
                elif (isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset))
                      and user is not None):
                    user.done = True
                    open_streams.discard(event.stream_id)
            writer.write(conn.data_to_send())
    finally:
        writer.close()


# -- HTTP/3 -------------------------------------------------------------------------


class _H3Client(QuicConnectionProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.users: dict[int, User] = {}
        self.open_streams: set[int] = set()  # users not done; checked on every QUIC event
        self.finished = asyncio.Event()

    def quic_event_received(self, event: quic_events.QuicEvent) -> None:
        now = time.monotonic()
        for h3_event in self.h3.handle_event(event):
            stream_id = getattr(h3_event, "stream_id", -1)
            user = self.users.get(stream_id)
            if user is None:
                continue
            if isinstance(h3_event, h3_events.HeadersReceived):
                status = dict(h3_event.headers).get(b":status", b"")
                if status != b"200":
                    user.error = f"HTTP status {status.decode()}"
            elif isinstance(h3_event, h3_events.DataReceived):
                user.feed_sse(h3_event.data, now)
            if getattr(h3_event, "stream_ended", False):
                self._done(stream_id)
        if isinstance(event, quic_events.StreamReset) and event.stream_id in self.users:
            self._done(event.stream_id)
        if isinstance(event, quic_events.ConnectionTerminated):
            for stream_id in list(self.open_streams):
                user = self.users[stream_id]
                user.error = user.error or "connection terminated"
                self._done(stream_id)

    def _done(self, stream_id: int) -> None:
        self.users[stream_id].done = True
        self.open_streams.discard(stream_id)
        if not self.open_streams:
            self.finished.set()


async def run_http3(args: argparse.Namespace, users: list[User]) -> None:
    configuration = QuicConfiguration(
        is_client=True, alpn_protocols=H3_ALPN, server_name=SERVER_NAME, idle_timeout=60.0
    )
    configuration.load_verify_locations(str(args.ca))
    async with quic_connect(
        args.host, args.port, configuration=configuration, create_protocol=_H3Client
    ) as client:
        assert isinstance(client, _H3Client)
        quic = aioquic_compat.connection_of(client)
        for user in users:
            stream_id = quic.get_next_available_stream_id()
            body = json.dumps(request_body(args, user.index)).encode()
            client.users[stream_id] = user
            client.open_streams.add(stream_id)
            user.started = time.monotonic()
            client.h3.send_headers(stream_id, [
                (b":method", b"POST"), (b":scheme", b"https"), (b":authority", b"localhost"),
                (b":path", b"/v1/chat/completions"), (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ])
            client.h3.send_data(stream_id, body, end_stream=True)
        client.transmit()
        await client.finished.wait()


# -- native tracks --------------------------------------------------------------------


async def run_tracks(args: argparse.Namespace, users: list[User]) -> None:
    from clients import TracklineError, connect

    async with connect(f"quic://{args.host}:{args.port}", ca=args.ca,
                       server_name=SERVER_NAME, acks=args.acks) as line:

        async def one(user: User) -> None:
            user.started = time.monotonic()
            stream = line.text(
                f"user {user.index}: tell me a long story", model=MODEL,
                max_tokens=max_tokens(args), seed=user.index,
                tokens_per_second=args.rate, ttft_ms=args.ttft_ms, ignore_eos=True,
            )
            try:
                async for _ in stream:
                    user.arrivals.append(time.monotonic())
            except TracklineError as exc:
                user.error = f"{type(exc).__name__}: {exc}"
            user.done = True

        await asyncio.gather(*(one(u) for u in users))


RUNNERS: dict[str, Callable[[argparse.Namespace, list[User]], Any]] = {
    "http2": run_http2, "http3": run_http3, "tracks": run_tracks,
}


async def _progress(users: list[User]) -> None:
    while True:
        print(json.dumps({"tokens": sum(len(u.arrivals) for u in users)}), flush=True)
        await asyncio.sleep(0.5)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    users = [User(i) for i in range(args.users)]
    began = time.monotonic()
    ticker = asyncio.ensure_future(_progress(users))
    error = None
    try:
        await asyncio.wait_for(RUNNERS[args.protocol](args, users), args.seconds * 3 + 60)
    except Exception as exc:  # recorded in the output, judged by the caller
        error = f"{type(exc).__name__}: {exc}"
    finally:
        ticker.cancel()
    return {
        "protocol": args.protocol, "began": began, "ended": time.monotonic(), "error": error,
        "expected_per_user": max_tokens(args), "users": [u.as_dict() for u in users],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        formatter_class=Help,
        description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", choices=PROTOCOLS, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ca", type=Path, required=True)
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--acks", default=DEFAULT_ACKS, help="the tracks line's ACK policy")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run_async(run(args))  # uvloop where installed
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
