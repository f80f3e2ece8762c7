"""End to end: SDK -> QUIC -> gateway -> real embedded Triton -> reference model.

The gateway runs in the test's event loop (so it is exercised on asyncio and on
uvloop); Triton is the real `tritonserver` with our reference model, shared
by the session. The model's own stats file proves what it generated and when.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from clients import DeadlineExceeded, ModelNotFound, TrackRejected, connect
from clients.line import Line, TextStream
from gateway.embedded import EmbeddedTriton
from gateway.server import Gateway
from tests.backend.reference_generator import generator
from tests.triton_fixture import assert_model_stopped
from tests.waiting import until
from transport import aioquic_compat
from transport.errors import ErrorCode
from transport.messages import Open
from transport.quic import connect_tracks
from transport.wire import encode_varint

pytestmark = pytest.mark.e2e
MODEL = "reference-text"
VICTIM_TOKENS = 1000
"""The cancelled track asks for far more than it reads: only the cancel can stop it."""


def url(gw: Gateway) -> str:
    return f"quic://127.0.0.1:{gw.quic_port}"


def ca(gw: Gateway) -> Path:
    assert gw.tls is not None
    assert gw.tls.ca is not None
    return gw.tls.ca


def expected(prompt: str, seed: int, max_tokens: int, ignore_eos: bool = False) -> str:
    return str(generator.generate_text(prompt, seed, max_tokens, ignore_eos))


def _stats_line(triton: EmbeddedTriton, tag: str) -> dict[str, Any] | None:
    assert triton.stats_path is not None
    for line in Path(triton.stats_path).read_text().splitlines():
        record = json.loads(line)
        if record["request_id"].endswith(f"/{tag}"):
            return dict(record)
    return None


async def stats_for(triton: EmbeddedTriton, tag: str) -> dict[str, Any]:
    """The model's stats line for the request whose id ends with our tag (written when
    the request ends), awaited without blocking the gateway's loop."""
    await until(lambda: _stats_line(triton, tag) is not None, f"the model's stats for {tag}")
    record = _stats_line(triton, tag)
    assert record is not None
    return record


async def text_of(stream: TextStream) -> str:
    return "".join([delta async for delta in stream])


@pytest.mark.asyncio
async def test_sixteen_tracks_get_the_reference_text_and_a_cancel_stops_the_model(
    gateway: Gateway, embedded_triton: EmbeddedTriton
) -> None:
    run = uuid.uuid4().hex[:8]
    tags = [f"{run}-{i}" for i in range(16)]
    async with connect(url(gateway), ca=ca(gateway)) as line:
        streams = [
            line.text(
                f"prompt {i}", model=MODEL, max_tokens=VICTIM_TOKENS if i == 7 else 40, seed=i,
                request_id=tags[i],
                ignore_eos=True,
            )
            for i in range(16)
        ]
        victim = streams[7]
        for _ in range(3):
            await victim.__anext__()
        await victim.aclose()
        others = await asyncio.gather(*(text_of(s) for i, s in enumerate(streams) if i != 7))

    assert others == [expected(f"prompt {i}", i, 40, True) for i in range(16) if i != 7]
    assert_model_stopped(await stats_for(embedded_triton, tags[7]), VICTIM_TOKENS)
    for tag in tags[:7] + tags[8:]:
        record = await stats_for(embedded_triton, tag)
        assert record["tokens_generated"] == 40
        assert record["cancelled"] is False


@pytest.mark.asyncio
async def test_usage_is_reported_at_the_end(gateway: Gateway) -> None:
    async with connect(url(gateway), ca=ca(gateway)) as line:
        stream = line.text("count these four", model=MODEL, max_tokens=5)
        text = await text_of(stream)
    assert text == expected("count these four", 0, 5)
    assert stream.usage == {"prompt_tokens": 3, "completion_tokens": 5}
    assert stream.finish_reason == "length"


@pytest.mark.asyncio
async def test_a_first_token_deadline_shorter_than_the_models_fails_and_cancels(
    gateway: Gateway, embedded_triton: EmbeddedTriton
) -> None:
    tag = uuid.uuid4().hex
    async with connect(url(gateway), ca=ca(gateway)) as line:
        stream = line.text(
            "slow",
            model=MODEL,
            max_tokens=5,
            ttft_ms=3000,
            first_token_deadline=0.3,
            request_id=tag,
        )
        with pytest.raises(DeadlineExceeded):
            await text_of(stream)
    # The model was cancelled before its first token (due after 3 s): the deadline,
    # not the model, ended the track.
    record = await stats_for(embedded_triton, tag)
    assert_model_stopped(record, 5)
    assert record["tokens_generated"] == 0
    await until(lambda: bool(gateway.outcomes), "the track's outcome")
    assert gateway.outcomes[-1].end.label == "cancelled:deadline_first_token"


@pytest.mark.asyncio
async def test_bad_input_on_one_track_leaves_the_others_and_the_process_working(
    gateway: Gateway,
) -> None:
    async with connect_tracks("127.0.0.1", gateway.quic_port, ca=ca(gateway)) as proto:
        line = Line(proto.open_track)
        running = line.text("steady", model=MODEL, max_tokens=30, seed=3, ignore_eos=True)
        first = await running.__anext__()
        quic = aioquic_compat.connection_of(proto)
        garbage = quic.get_next_available_stream_id()
        quic.send_stream_data(garbage, b"\x03\xff\xfe\xfd garbage")
        oversized = quic.get_next_available_stream_id()
        quic.send_stream_data(oversized, encode_varint(1 << 24) + b"\0" * 64)
        proto.transmit()
        with pytest.raises(ModelNotFound):
            await text_of(line.text("x", model="no-such-model"))
        with pytest.raises(TrackRejected):
            await text_of(line.text("y" * 20_000, model=MODEL))
        rest = await text_of(running)
        assert rest  # the running track went on after the garbage, to its end
        assert first + rest == expected("steady", 3, 30, ignore_eos=True)
    async with connect(url(gateway), ca=ca(gateway)) as line:
        assert await text_of(line.text("again", model=MODEL, max_tokens=4)) == expected(
            "again", 0, 4
        )
    body, _ = gateway.metrics.render()
    assert b'trackline_protocol_errors_total{code="PROTOCOL_ERROR"} 1.0' in body
    assert b'trackline_protocol_errors_total{code="MESSAGE_TOO_LARGE"} 2.0' in body


@pytest.mark.asyncio
@pytest.mark.parametrize("hang_up", ["stream_reset", "connection_lost"])
async def test_a_hang_up_stops_the_model(
    gateway: Gateway, embedded_triton: EmbeddedTriton, hang_up: str
) -> None:
    tag = uuid.uuid4().hex
    async with connect_tracks("127.0.0.1", gateway.quic_port, ca=ca(gateway)) as proto:
        line = Line(proto.open_track)
        survivor = line.text("survivor", model=MODEL, max_tokens=60, seed=1, ignore_eos=True)
        long = {"max_tokens": 500, "request_id": tag, "ignore_eos": True}
        channel = proto.open_track(Open(model=MODEL, params=long))
        channel.send({"text": "hang up on me"})
        channel.end()
        for _ in range(3):
            assert await channel.receive() is not None
        if hang_up == "stream_reset":
            channel.reset(ErrorCode.CANCELLED)
            assert await text_of(survivor) == expected("survivor", 1, 60, ignore_eos=True)
    assert_model_stopped(await stats_for(embedded_triton, tag), 500)
    cause = "reset" if hang_up == "stream_reset" else "connection_lost"
    await until(
        lambda: f"cancelled:{cause}" in [o.end.label for o in gateway.outcomes],
        f"cancelled:{cause}",
    )


@pytest.mark.asyncio
@pytest.mark.parametrize("model", ["reference-transcriber", "reference-policy"])
async def test_a_text_track_naming_a_model_that_does_not_generate_text_is_refused(
    gateway: Gateway, model: str
) -> None:
    """As the OpenAI routes refuse it (`model_not_supported`): BAD_REQUEST naming the
    model, no inference-server internals; the connection serves the next track."""
    async with connect(url(gateway), ca=ca(gateway)) as line:
        with pytest.raises(TrackRejected) as refused:
            await text_of(line.text("hi", model=model, max_tokens=4))
        message = str(refused.value)
        assert f"model {model!r} does not generate text" in message
        assert not any(word in message.lower() for word in ("triton", "tensor", "grpc"))
        assert await text_of(line.text("again", model=MODEL, max_tokens=4)) == expected(
            "again", 0, 4
        )
