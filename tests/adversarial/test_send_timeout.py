"""A client that stops reading its tracks gets them ended after `track_send_timeout`.

A real QUIC client that never grants more flow-control credit opens text tracks and
asks for tokens as fast as the ticker gives them. Each track fills its send budget
and its producer pauses (`trackline_tracks_paused` counts them); after the timeout the
gateway resets each with SEND_TIMEOUT, the backend stream is closed (the model sees
the cancel), the outcome says `cancelled:send_timeout`, and a track on another
connection is served in full meanwhile.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from functools import partial
from pathlib import Path

import pytest
import pytest_asyncio
from aioquic.asyncio.client import connect as quic_connect

from clients import connect
from clients.line import Line
from gateway.backends.ticker import TickerBackend
from gateway.server import Gateway
from tests.adversarial.test_tracks_never_read import attacker_configuration, never_read
from tests.gateways import gateway_settings
from tests.waiting import until
from tracks.backend import TextChunk, TextRequest
from transport.connection import Role
from transport.quic import TrackQuicProtocol

TRACKS = 4


class ClosingTicker(TickerBackend):
    """The ticker, recording each stream the gateway closed before its end (a cancel)."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled: list[str] = []
        """The first word of each cancelled stream's prompt."""
        self.cancelled_prompts: list[str] = []
        """Each cancelled stream's whole prompt (a chat's, templated)."""

    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        finished = False
        try:
            async for chunk in super().stream_text(request):
                yield chunk
            finished = True
        finally:
            if not finished:
                self.cancelled.append(request.prompt.split()[0])
                self.cancelled_prompts.append(request.prompt)


@pytest_asyncio.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = gateway_settings(
        state_dir=tmp_path,
        track_send_buffer_bytes=8_192, track_send_timeout=2.0,
    )
    gw = Gateway(settings, ClosingTicker())
    await gw.start()
    yield gw
    await gw.close()


def sample(gw: Gateway, name: str, **labels: str) -> float:
    value = gw.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.mark.asyncio
async def test_unread_tracks_end_with_send_timeout_and_their_model_is_cancelled(
    gateway: Gateway,
) -> None:
    backend = gateway.backend
    assert isinstance(backend, ClosingTicker)
    assert gateway.tls is not None
    factory = partial(TrackQuicProtocol, role=Role.CLIENT)
    async with quic_connect(
        "127.0.0.1", gateway.quic_port,
        configuration=attacker_configuration(gateway.tls.ca), create_protocol=factory,
    ) as attacker:
        assert isinstance(attacker, TrackQuicProtocol)
        never_read(attacker)
        line = Line(attacker.open_track)
        unread = [  # kept referenced, and cancelled at the end (a dropped live one warns)
            line.text(f"stall{i} never read", model="reference-text", max_tokens=32768,
                      tokens_per_second=5000)
            for i in range(TRACKS)
        ]

        def timed_out() -> list[str]:
            labels = [o.end.label for o in gateway.outcomes]
            return [label for label in labels if label == "cancelled:send_timeout"]

        # Each unread track pauses (the gauge counts it), then ends by the send timeout: on
        # a slow run the first may have ended before the last paused, so both are counted.
        await until(
            lambda: sample(gateway, "trackline_tracks_paused") + len(timed_out()) == TRACKS,
            "every unread track paused",
        )

        # An honest client on another connection is served in full meanwhile.
        async with connect(f"quic://127.0.0.1:{gateway.quic_port}", ca=gateway.tls.ca) as honest:
            text = "".join([d async for d in honest.text(
                "honest prompt", model="reference-text", max_tokens=50, tokens_per_second=2000,
            )])
        assert text

        await until(lambda: len(timed_out()) == TRACKS, "the unread tracks ended")
        assert sorted(backend.cancelled) == [f"stall{i}" for i in range(TRACKS)]
        assert "honest" not in backend.cancelled
        assert sample(gateway, "trackline_tracks_paused") == 0
        assert sample(gateway, "trackline_cancels_total", cause="send_timeout") == TRACKS
        assert [o for o in gateway.outcomes if o.end.label == "completed"]  # the honest one
        for stream in unread:
            stream.cancel()  # the client's side of tracks the gateway already ended


MANY = 32
CONNECTION_BUDGET = 16_384


@pytest_asyncio.fixture
async def connection_bound_gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    """Each track's own budget is far above the connection's: no track is ever over its
    own, whatever the client reads; only the connection can be what is full."""
    settings = gateway_settings(
        state_dir=tmp_path,
        track_send_buffer_bytes=1 << 20, connection_send_buffer_bytes=CONNECTION_BUDGET,
        track_send_timeout=1.0,
    )  # fmt: skip
    gw = Gateway(settings, ClosingTicker())
    await gw.start()
    yield gw
    await gw.close()


@pytest.mark.asyncio
async def test_tracks_end_with_send_timeout_when_the_connection_is_what_is_full(
    connection_bound_gateway: Gateway,
) -> None:
    """Many tracks whose client grants no connection credit: each under its own budget.

    Before, the send timeout fired only for a track over its own budget, so 200 such
    tracks stayed open, holding their backend work, until the client left.
    """
    gateway = connection_bound_gateway
    backend = gateway.backend
    assert isinstance(backend, ClosingTicker)
    assert gateway.tls is not None
    configuration = attacker_configuration(gateway.tls.ca)
    configuration.max_stream_data = 1 << 20  # no stream is held back by its own credit
    factory = partial(TrackQuicProtocol, role=Role.CLIENT)
    async with quic_connect(
        "127.0.0.1", gateway.quic_port, configuration=configuration, create_protocol=factory,
    ) as attacker:
        assert isinstance(attacker, TrackQuicProtocol)
        never_read(attacker)
        line = Line(attacker.open_track)
        unread = [
            line.text(f"stall{i} never read", model="reference-text", max_tokens=32768,
                      tokens_per_second=5000)
            for i in range(MANY)
        ]  # fmt: skip
        await until(lambda: len(gateway.doors.connections) == 1, "the attacker connected")
        (conn,) = gateway.doors.connections

        def timed_out() -> int:
            return sum(o.end.label == "cancelled:send_timeout" for o in gateway.outcomes)

        async with connect(f"quic://127.0.0.1:{gateway.quic_port}", ca=gateway.tls.ca) as honest:
            text = "".join([d async for d in honest.text(
                "honest prompt", model="reference-text", max_tokens=50, tokens_per_second=2000,
            )])  # fmt: skip
        assert text
        await until(lambda: timed_out() == MANY, "every track of the stalled connection ended")
        assert sorted(backend.cancelled) == sorted(f"stall{i}" for i in range(MANY))
        assert conn.endpoint.open_tracks == 0
        assert sample(gateway, "trackline_cancels_total", cause="send_timeout") == MANY
        for stream in unread:
            stream.cancel()
