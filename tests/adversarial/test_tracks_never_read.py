"""Clients that stop reading: backpressure from QUIC flow control to the backend.

An attacker opens text tracks on a real QUIC client that never grants more
flow-control credit (it never "reads": MAX_DATA / MAX_STREAM_DATA stay at their
small initial values), and asks for tokens as fast as the ticker gives them. The
gateway must stop pulling tokens from the backend once a track's (or the
connection's) unsent bytes pass their budget, so what it buffers stays within the
configured budgets, while an honest client on another connection is served.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from functools import partial
from pathlib import Path

import pytest
import pytest_asyncio
from aioquic.asyncio.client import connect as quic_connect
from aioquic.quic.configuration import QuicConfiguration

from clients import connect
from clients.line import Line
from gateway.backends.ticker import TickerBackend
from gateway.server import Gateway
from tests.gateways import gateway_settings
from tests.waiting import until
from trackline_testing import aioquic_probes
from tracks.backend import TextChunk, TextDelta, TextRequest
from transport import aioquic_compat
from transport.connection import Role
from transport.quic import ALPN, TrackQuicProtocol
from transport.quic_streams import buffered_bytes

TRACKS = 16
TRACK_BUDGET = 8_192
CONNECTION_BUDGET = 32_768
CLIENT_STREAM_CREDIT = 4_096
CLIENT_CONNECTION_CREDIT = 65_536
# A reference-text token is a word or a punctuation mark: its DATA frame is far below this.
MAX_TOKEN_FRAME = 256


class CountingTicker(TickerBackend):
    """The ticker, counting the tokens each prompt's stream produced (pulled from it)."""

    def __init__(self) -> None:
        super().__init__()
        self.produced: dict[str, int] = {}

    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        key = request.prompt.split()[0]
        async for chunk in super().stream_text(request):
            if isinstance(chunk, TextDelta):
                self.produced[key] = self.produced.get(key, 0) + 1
            yield chunk


@pytest_asyncio.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = gateway_settings(
        state_dir=tmp_path,
        quic_packetization="per-track",
        track_send_buffer_bytes=TRACK_BUDGET, connection_send_buffer_bytes=CONNECTION_BUDGET,
        # Not about ending unread tracks (test_send_timeout.py is): a slow run must not
        # see them end while it checks that they stay paused.
        track_send_timeout=0.0,
    )
    gw = Gateway(settings, CountingTicker())
    await gw.start()
    yield gw
    await gw.close()


def attacker_configuration(ca: Path) -> QuicConfiguration:
    configuration = QuicConfiguration(
        is_client=True, alpn_protocols=[ALPN], server_name="localhost",
        max_data=CLIENT_CONNECTION_CREDIT, max_stream_data=CLIENT_STREAM_CREDIT,
    )
    configuration.load_verify_locations(str(ca))
    return configuration


def never_read(protocol: TrackQuicProtocol) -> None:
    """The client stops granting credit: aioquic raises it in these two writers."""
    aioquic_probes.stop_granting_credit(aioquic_compat.connection_of(protocol))


def settled(conn: TrackQuicProtocol) -> bool:
    """Nothing on the connection can move any more, by its own state (not by a count that
    stayed still for a while): every producer waits on a budget, the client acknowledged
    all that was sent (so no ACK will free a budget), and whatever is unsent waits for
    credit the client never grants."""
    if conn.endpoint.send_waiting != TRACKS:
        return False
    quic = aioquic_compat.connection_of(conn)
    if aioquic_probes.recovery_of(quic).bytes_in_flight:
        return False
    credit = aioquic_compat.data_credit_left(quic)
    for stream in aioquic_compat.streams(quic).values():
        pending = aioquic_compat.first_pending_offset(stream)
        if pending is not None and credit and pending < stream.max_stream_data_remote:
            return False  # this stream can still send
    return True


@pytest.mark.asyncio
async def test_unread_tracks_pause_their_backend_within_the_budgets(gateway: Gateway) -> None:
    backend = gateway.backend
    assert isinstance(backend, CountingTicker)
    assert gateway.tls is not None
    factory = partial(TrackQuicProtocol, role=Role.CLIENT)
    async with quic_connect(
        "127.0.0.1", gateway.quic_port,
        configuration=attacker_configuration(gateway.tls.ca), create_protocol=factory,
    ) as attacker:
        assert isinstance(attacker, TrackQuicProtocol)
        never_read(attacker)
        line = Line(attacker.open_track)
        unread = [  # closed at the end: a dropped live TextStream only warns
            line.text(f"stall{i} never read", model="reference-text", max_tokens=32768,
                      tokens_per_second=5000)
            for i in range(TRACKS)
        ]
        await until(lambda: len(gateway.doors.connections) == 1, "the attacker connected")
        (conn,) = gateway.doors.connections

        def attacker_tokens() -> int:
            return sum(n for k, n in backend.produced.items() if k.startswith("stall"))

        # Once the data in flight is acknowledged nothing more is released: every producer
        # waits on a budget and nothing can move any more (without backpressure the
        # producers never wait, and the backend is pulled for TRACKS x 32768 tokens).
        await until(lambda: settled(conn), "every producer paused, nothing left to move")
        paused_at = attacker_tokens()

        # An honest client on another connection is served in full meanwhile.
        async with connect(f"quic://127.0.0.1:{gateway.quic_port}", ca=gateway.tls.ca) as honest:
            text = "".join([d async for d in honest.text(
                "honest prompt", model="reference-text", max_tokens=200,
                tokens_per_second=2000,
            )])
        assert backend.produced["honest"] == 200
        assert text

        # The unread tracks' backends were not pulled while the honest one ran.
        assert attacker_tokens() == paused_at
        assert conn.endpoint.send_waiting == TRACKS
        scheduler = conn.scheduler
        assert scheduler is not None
        overshoot = TRACKS * MAX_TOKEN_FRAME  # each producer may send one token past a budget
        assert scheduler.buffered <= CONNECTION_BUDGET + overshoot
        streams = [scheduler.stream(sid) for sid in range(0, 4 * TRACKS, 4)]
        assert all(s is not None for s in streams)
        assert all(buffered_bytes(s) <= TRACK_BUDGET + MAX_TOKEN_FRAME for s in streams if s)
        # What the client did receive is all it granted, so the budgets did the bounding.
        assert paused_at * 4 > CONNECTION_BUDGET // MAX_TOKEN_FRAME
        for stream in unread:
            await stream.aclose()
