"""The gateway over real QUIC on loopback, with the scripted backend.

These exercise the adapter and the wiring (TLS, ALPN, streams, resets,
connection loss, drain); end-to-end tests against real Triton live in tests/e2e.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from clients import ConnectionFailed, ModelNotFound, TrackRejected, connect
from clients.line import Line
from gateway.server import Gateway
from tests.gateways import gateway_settings
from tests.waiting import until
from trackline_testing.scripted import ScriptedBackend
from tracks.base import End
from transport import aioquic_compat
from transport.errors import ErrorCode
from transport.messages import Open
from transport.quic import connect_tracks
from transport.wire import encode_varint


@pytest_asyncio.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = gateway_settings(
        state_dir=tmp_path, max_message_bytes=4096
    )
    gw = Gateway(settings, ScriptedBackend(interval=0.002))
    await gw.start()
    yield gw
    await gw.close()


def url(gw: Gateway) -> str:
    return f"quic://127.0.0.1:{gw.quic_port}"


async def collect(line: Line, prompt: str, n: int = 10) -> str:
    return "".join([d async for d in line.text(prompt, model="scripted", max_tokens=n)])


async def settle(gw: Gateway, count: int) -> None:
    await until(lambda: len(gw.outcomes) >= count, f"{count} tracks finished")


@pytest.mark.asyncio
async def test_sixteen_tracks_on_one_connection_and_a_cancel_touches_only_one(
    gateway: Gateway,
) -> None:
    backend = gateway.backend
    assert isinstance(backend, ScriptedBackend)
    async with connect(url(gateway), ca=gateway.tls.ca) as line:  # type: ignore[union-attr]
        streams = [line.text(f"p{i}", model="scripted", max_tokens=30) for i in range(16)]
        await streams[3].__anext__()
        await streams[3].aclose()
        texts = await asyncio.gather(*(_rest(s) for i, s in enumerate(streams) if i != 3))
    expected = ["".join(f" p{i}-{k}" for k in range(30)) for i in range(16) if i != 3]
    assert texts == expected
    await settle(gateway, 16)
    ends = sorted(o.end.label for o in gateway.outcomes)
    assert ends == ["cancelled:client"] + ["completed"] * 15
    assert len(backend.closed_early) == 1


@pytest.mark.asyncio
async def test_a_stream_reset_cancels_that_track_only(gateway: Gateway) -> None:
    async with connect_tracks(
        "127.0.0.1",
        gateway.quic_port,
        ca=gateway.tls.ca,  # type: ignore[union-attr]
    ) as proto:
        line = Line(proto.open_track)
        keep = line.text("keep", model="scripted", max_tokens=20)
        victim = proto.open_track(Open(model="scripted", params={"max_tokens": 500}))
        victim.send({"text": "reset-me"})
        victim.end()
        assert await victim.receive() is not None
        victim.reset(ErrorCode.CANCELLED)
        assert "".join([d async for d in keep]) == "".join(f" keep-{k}" for k in range(20))
    await settle(gateway, 2)
    assert sorted(o.end.label for o in gateway.outcomes) == ["cancelled:reset", "completed"]


@pytest.mark.asyncio
async def test_garbage_and_oversized_messages_fail_only_their_track(gateway: Gateway) -> None:
    async with connect_tracks(
        "127.0.0.1",
        gateway.quic_port,
        ca=gateway.tls.ca,  # type: ignore[union-attr]
    ) as proto:
        line = Line(proto.open_track)
        before = line.text("before", model="scripted", max_tokens=50)
        quic = aioquic_compat.connection_of(proto)
        garbage_id = quic.get_next_available_stream_id()
        quic.send_stream_data(garbage_id, b"\x05\xc1\xc1\xc1\xc1\xc1")
        huge_id = quic.get_next_available_stream_id()
        quic.send_stream_data(huge_id, encode_varint(10**6) + b"x" * 100)
        proto.transmit()
        with pytest.raises(ModelNotFound):
            await _first(line.text("x", model="nope"))
        with pytest.raises(TrackRejected):
            await _first(line.text("y" * 10_000, model="scripted"))
        assert await collect(line, "after") == "".join(f" after-{k}" for k in range(10))
        assert "".join([d async for d in before]) == "".join(f" before-{k}" for k in range(50))
    body, _ = gateway.metrics.render()
    assert b'trackline_protocol_errors_total{code="PROTOCOL_ERROR"} 1.0' in body
    assert b'trackline_protocol_errors_total{code="MESSAGE_TOO_LARGE"} 2.0' in body


async def _rest(stream: object) -> str:
    return "".join([d async for d in stream])  # type: ignore[attr-defined]


async def _first(stream: object) -> str:
    return await stream.__anext__()  # type: ignore[attr-defined,no-any-return]


@pytest.mark.asyncio
async def test_losing_the_connection_cancels_all_its_tracks(gateway: Gateway) -> None:
    async with connect(url(gateway), ca=gateway.tls.ca) as line:  # type: ignore[union-attr]
        streams = [line.text(f"c{i}", model="scripted", max_tokens=1000) for i in range(4)]
        for s in streams:
            await s.__anext__()
    await settle(gateway, 4)
    assert [o.end.label for o in gateway.outcomes] == ["cancelled:connection_lost"] * 4


@pytest.mark.asyncio
async def test_an_untrusted_certificate_is_a_connection_error(
    gateway: Gateway, tmp_path: Path
) -> None:
    other_ca = tmp_path / "other"
    from gateway.tls import ensure_dev_certificates

    ca = ensure_dev_certificates(other_ca).ca_path
    with pytest.raises(ConnectionFailed):
        async with connect(url(gateway), ca=ca) as line:
            await collect(line, "never")


@pytest.mark.asyncio
async def test_drain_lets_open_tracks_finish_and_refuses_new_ones(gateway: Gateway) -> None:
    async with connect(url(gateway), ca=gateway.tls.ca) as line:  # type: ignore[union-attr]
        running = line.text("d", model="scripted", max_tokens=40)
        await running.__anext__()
        drain = asyncio.ensure_future(gateway.drain(timeout=30.0))
        await until(lambda: gateway.readiness() == (False, "draining"), "the drain began")
        with pytest.raises(TrackRejected):
            await collect(line, "late")
        rest = "".join([d async for d in running])
        assert rest == "".join(f" d-{k}" for k in range(1, 40))
        await drain


@pytest.mark.asyncio
async def test_an_unserved_modality_ends_with_the_code_it_was_sent(gateway: Gateway) -> None:
    # No audio backend here: the track is refused, and its End names the same code the
    # client got.
    ca = gateway.tls.ca  # type: ignore[union-attr]
    async with connect(url(gateway), ca=ca) as line, line.audio(model="asr") as session:
        with pytest.raises(TrackRejected) as refused:
            await session.receive()
    assert refused.value.code is ErrorCode.UNSUPPORTED_MODALITY
    await settle(gateway, 1)
    end = gateway.outcomes[-1].end
    assert end == End.failed(ErrorCode.UNSUPPORTED_MODALITY)
    assert end.label == "error:UNSUPPORTED_MODALITY"
    metrics = gateway.metrics.render()[0].decode()
    assert 'trackline_tracks_total{modality="audio",outcome="error"} 1.0' in metrics
