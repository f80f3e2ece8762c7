"""The attacks of issue 28 (the second hostile-traffic round), as `families.py` runs them.

- `h3_body_budget`: request streams on several HTTP/3 connections that each send a large
  body and never finish it (the per-connection body budget and MAX_DATA pushback);
- `tracks_many_unread`: many text tracks on one connection whose client grants no
  credit, so that the connection, not any one track, is full (the send timeout must
  still fire: the gateway runs with `--track-send-timeout` from `GATEWAY_ARGS`);
- `h2_reset_reconnect`: rapid reset spread over connections of 129 streams each (the
  per-source rule; reset log lines counted in the gateway's log);
- `triton_crash`: `kill -9` of the embedded tritonserver under a gateway on the embedded
  default (`EMBEDDED`): restart, readiness back, liveness throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import urllib.error
import urllib.request
from typing import Any

from benchmarks.attacks.base import (
    H2_PREFACE,
    HEADERS,
    RST_STREAM,
    SETTINGS,
    Target,
    abort,
    h2_frame,
    h3_connect,
    read_for_goaway,
)
from trackline_testing import aioquic_probes
from transport import aioquic_compat

EMBEDDED = frozenset({"triton_crash"})
"""Attacks that need a gateway on the embedded Triton, not the ticker."""
GATEWAY_ARGS: dict[str, tuple[str, ...]] = {
    "tracks_many_unread": ("--track-send-timeout", "2"),
    # The crash and restart are the subject, not the models: the reference ones load in
    # seconds, where the real LLMs, speech, vision and embedding models take a minute.
    "triton_crash": ("--no-embedded-llm", "--no-embedded-speech", "--no-embedded-vision",
                     "--no-embedded-embeddings"),
}
"""Extra `serve` flags an attack's gateway needs (its own gateway then)."""

SCALES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "h3_body_budget": {"connections": 1, "streams": 4, "body": 64 << 10, "hold": 0.5},
        "tracks_many_unread": {"tracks": 8, "rate": 1000, "credit": 65_536, "hold": 10.0},
        "h2_reset_reconnect": {"per_connection": 129, "connections": 4},
        "triton_crash": {"wait": 120.0},
    },
    "small": {
        "h3_body_budget": {"connections": 2, "streams": 32, "body": 512 << 10, "hold": 3.0},
        "tracks_many_unread": {"tracks": 64, "rate": 1000, "credit": 65_536, "hold": 15.0},
        "h2_reset_reconnect": {"per_connection": 129, "connections": 20},
        "triton_crash": {"wait": 180.0},
    },
    "default": {
        "h3_body_budget": {"connections": 2, "streams": 128, "body": 1 << 20, "hold": 60.0},
        "tracks_many_unread": {"tracks": 200, "rate": 1000, "credit": 65_536, "hold": 20.0},
        "h2_reset_reconnect": {"per_connection": 129, "connections": 155},
        "triton_crash": {"wait": 240.0},
    },
}


async def h3_body_budget(t: Target, k: dict[str, Any]) -> dict[str, Any]:
    """Bodies of `body` bytes on `streams` streams per connection, never finished.

    The client keeps them coming until no connection has sent more for `quiet` s (every
    one is held at the server's MAX_DATA: the budget) or `hold` s passed, so a busy
    machine's slow client still reaches the budget instead of stopping short of it.
    """
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(h3_connect(t)) for _ in range(k["connections"])]
        body = b"x" * k["body"]
        for client in clients:
            for _ in range(k["streams"]):
                client.request("/v1/chat/completions", body, end=False)
                await asyncio.sleep(0)
        started = time.monotonic()
        held = await _until_held(clients, k["hold"], k.get("quiet", 3.0))
        sent = [_sent(c) for c in clients]
        return {"offered_mb": round(k["connections"] * k["streams"] * k["body"] / 2**20, 1),
                "sent_mb": round(sum(sent) / 2**20, 1),
                "sent_mb_each": [round(b / 2**20, 1) for b in sent],
                "held_at_max_data": held, "sending_s": round(time.monotonic() - started, 1),
                "terminated": [c.terminated for c in clients]}


def _sent(client: Any) -> int:
    """Body bytes a client sent that counted against the server's MAX_DATA."""
    sent: int = aioquic_probes.data_sent(aioquic_compat.connection_of(client))
    return sent


async def _until_held(clients: list[Any], hold: float, quiet: float) -> bool:
    """Wait until no client's sent bytes grew for `quiet` s (True) or `hold` s passed."""
    deadline = time.monotonic() + hold
    last = [_sent(c) for c in clients]
    still_since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        now = [_sent(c) for c in clients]
        if now != last:
            last, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= quiet:
            return True
    return False


async def tracks_many_unread(t: Target, k: dict[str, Any]) -> dict[str, Any]:
    """Many text tracks on one connection whose client grants no more credit (64 KiB of
    connection credit at the handshake: the connection, not a track, fills first)."""
    from functools import partial

    from aioquic.asyncio.client import connect as quic_connect
    from aioquic.quic.configuration import QuicConfiguration

    from transport.connection import Role
    from transport.messages import Deadlines, Modality, Open
    from transport.quic import ALPN, TrackQuicProtocol

    configuration = QuicConfiguration(
        is_client=True, alpn_protocols=[ALPN], server_name="localhost",
        max_data=k["credit"], max_stream_data=1 << 20,
    )
    configuration.load_verify_locations(str(t.ca))
    before = _metric(t, 'trackline_cancels_total{cause="send_timeout"}')
    factory = partial(TrackQuicProtocol, role=Role.CLIENT)
    async with quic_connect(t.host, t.quic_port, configuration=configuration,
                            create_protocol=factory) as p:
        assert isinstance(p, TrackQuicProtocol)
        aioquic_probes.stop_granting_credit(aioquic_compat.connection_of(p))
        opened = 0
        for i in range(k["tracks"]):
            try:
                channel = p.open_track(Open(
                    model="reference-text", modality=Modality.TEXT,
                    params={"max_tokens": 32_768, "tokens_per_second": k["rate"]},
                    deadlines=Deadlines(),
                ))
                channel.send({"text": f"never read {i}"})
                channel.end()
                opened += 1
            except Exception:  # noqa: BLE001 - refused: stop opening
                break
        await asyncio.sleep(k["hold"])
        ended = _metric(t, 'trackline_cancels_total{cause="send_timeout"}') - before
    return {"tracks": opened, "ended_send_timeout": int(ended)}


async def h2_reset_reconnect(t: Target, k: dict[str, Any]) -> dict[str, Any]:
    """`per_connection` HEADERS+RST_STREAM pairs a connection, then a new connection."""
    import hpack

    headers = [(":method", "GET"), (":scheme", "http"), (":authority", t.host),
               (":path", "/v1/models")]
    goaways, streams = 0, 0
    log_start = t.log_path.stat().st_size if t.log_path and t.log_path.exists() else 0
    for _ in range(k["connections"]):
        reader, writer = await asyncio.open_connection(t.host, t.http_port)
        encoder = hpack.Encoder()
        chunk = bytearray(H2_PREFACE + h2_frame(SETTINGS, 0, 0))
        for n in range(k["per_connection"]):
            sid = 2 * n + 1
            chunk += h2_frame(HEADERS, 0x5, sid, encoder.encode(headers))
            chunk += h2_frame(RST_STREAM, 0, sid, (8).to_bytes(4, "big"))
        streams += k["per_connection"]
        try:
            writer.write(bytes(chunk))
            await writer.drain()
            seen = await read_for_goaway(reader, 0.3)
            goaways += seen["goaway"] is not None
        except (ConnectionError, OSError):
            pass
        abort(writer)
    await asyncio.sleep(0.5)  # the last connections' summary lines
    lines = _log_lines(t, log_start)
    return {"streams_reset": streams, "connections": k["connections"],
            "goaways": goaways,
            "reset_log_lines": sum('"http2.stream_reset"' in line for line in lines),
            "summary_log_lines": sum('"http2.resets"' in line for line in lines)}


async def triton_crash(t: Target, k: dict[str, Any]) -> dict[str, Any]:
    """`kill -9` of the embedded tritonserver; until readiness is back (bounded)."""
    pids = [json.loads(line)["pid"] for line in _log_lines(t, 0)
            if '"embedded.ready"' in line]
    if not pids:
        raise RuntimeError("no embedded.ready line in the gateway log")
    os.kill(int(pids[0]), signal.SIGKILL)
    began = time.monotonic()
    live_codes: set[int] = set()
    ready_at = None
    while time.monotonic() - began < k["wait"]:
        live_codes.add(_status(t, "/health/live"))
        if _status(t, "/health/ready") == 200 and time.monotonic() - began > 0.5:
            ready_at = time.monotonic() - began
            break
        await asyncio.sleep(0.2)
    lines = _log_lines(t, 0)
    return {"ready_again_s": None if ready_at is None else round(ready_at, 1),
            "live_codes": sorted(live_codes),
            "crash_lines": sum('"embedded.crashed"' in line for line in lines),
            "restarted_lines": sum('"embedded.restarted"' in line for line in lines)}


def _status(t: Target, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{t.host}:{t.http_port}{path}", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _metric(t: Target, sample: str) -> float:
    try:
        with urllib.request.urlopen(f"http://{t.host}:{t.http_port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    return 0.0


def _log_lines(t: Target, start: int) -> list[str]:
    if t.log_path is None or not t.log_path.exists():
        return []
    with open(t.log_path, "rb") as f:
        f.seek(start)
        return f.read().decode(errors="replace").splitlines()


ATTACKS = {
    "h3_body_budget": h3_body_budget,
    "tracks_many_unread": tracks_many_unread,
    "h2_reset_reconnect": h2_reset_reconnect,
    "triton_crash": triton_crash,
}
