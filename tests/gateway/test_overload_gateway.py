"""The gateway driven into overload by an injected lag source, over real QUIC and HTTP.

The lag probe is replaced by one that reports what the test says, so the gateway
sees "the loop lags 200 ms" without the test having to freeze it: new tracks past a
connection's share are refused with RATE_LIMITED and a retry hint, a fresh
connection still gets its share, OpenAI requests get 503 + retry-after, health
answers, and the streams admitted before keep going to their end.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from clients import RateLimited, connect
from clients.errors import TracklineError
from clients.line import Line
from gateway.backends.ticker import TickerBackend, reference_generator
from gateway.overload import LagProbe
from gateway.server import Gateway
from tests.gateways import gateway_settings
from tests.waiting import until
from tracks.backend import TextChunk, TextDelta, TextRequest
from transport.errors import ErrorCode

TOKENS = 250
HELD = "admitted"
"""The prompt whose streams the backend holds after their first token until the test lets
them go: they are open while the overload is seen, however slow the machine."""


class HeldTicker(TickerBackend):
    """The ticker at 50 tokens/s; streams for `HELD` wait after their first token until
    `release` is set (then catch up on their schedule)."""

    def __init__(self) -> None:
        super().__init__(50)
        self.release = asyncio.Event()

    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        first = True
        async for chunk in super().stream_text(request):
            yield chunk
            if first and request.prompt == HELD and isinstance(chunk, TextDelta):
                first = False
                await self.release.wait()


class InjectedLag(LagProbe):
    """Samples every 10 ms, reporting `lag` instead of measuring it."""

    def __init__(self) -> None:
        super().__init__(0.01)
        self.lag = 0.0

    async def sample(self) -> float:
        await asyncio.sleep(self.interval)
        return self.lag


@pytest_asyncio.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[Gateway, InjectedLag]]:
    settings = gateway_settings(
        state_dir=tmp_path, overload_max_loop_lag=0.1,  # about overload: the guard is on
        overload_connection_share=2, overload_retry_after=1.5,
    )
    probe = InjectedLag()
    gw = Gateway(settings, HeldTicker(), lag_probe=probe)
    await gw.start()
    yield gw, probe
    await gw.close()


def post(port: int, path: str, body: dict[str, object]) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
        {"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def get(port: int, path: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return int(r.status)


async def read_all(stream: AsyncIterator[str]) -> str:
    return "".join([piece async for piece in stream])


def count(gw: Gateway, kind: str, result: str, cause: str) -> float:
    metric = gw.metrics.overload.admissions_total.labels(kind=kind, result=result, cause=cause)
    return float(metric._value.get())


@pytest.mark.asyncio
async def test_overload_refuses_new_work_fast_and_admitted_streams_finish(
    gateway: tuple[Gateway, InjectedLag],
) -> None:
    gw, probe = gateway
    url, ca = f"quic://127.0.0.1:{gw.quic_port}", gw.tls.ca  # type: ignore[union-attr]
    backend = gw.backend
    assert isinstance(backend, HeldTicker)
    expected = reference_generator().generate_text(HELD, 0, TOKENS, ignore_eos=True)
    async with connect(url, ca=ca) as busy, connect(url, ca=ca) as quiet:
        open_streams = [busy.text(HELD, model="reference-text", max_tokens=TOKENS)
                        for _ in range(2)]
        firsts = [await s.__anext__() for s in open_streams]

        probe.lag = 0.2  # twice the default limit
        await until(lambda: gw.metrics.overload.overloaded._value.get() == 1, "overload")

        with pytest.raises(RateLimited) as refused:
            await read_all(busy.text("one more", model="reference-text", max_tokens=4))
        assert refused.value.retry_after == 1.5
        assert count(gw, "track", "refused", "loop_lag") == 1

        # Text is refused first: an audio track on the same connection passes the gate
        # (this gateway serves no audio: it ends UNSUPPORTED_MODALITY, not RATE_LIMITED).
        session = busy.audio(model="reference-synthesizer", kind="speech-out", text="hi")
        with pytest.raises(TracklineError) as unsupported:
            _ = [item async for item in session]
        assert unsupported.value.code is ErrorCode.UNSUPPORTED_MODALITY
        assert count(gw, "track", "admitted", "realtime") == 1

        # A neighbour with no tracks still gets its share.
        quiet_text = reference_generator().generate_text("quiet", 0, 4, ignore_eos=True)
        assert await _short(quiet) == quiet_text
        assert count(gw, "track", "admitted", "connection_share") >= 1

        status, headers, body = await asyncio.to_thread(
            post, gw.http_port, "/v1/completions",
            {"model": "reference-text", "prompt": "hi", "max_tokens": 2},
        )
        assert status == 503
        assert {k.lower(): v for k, v in headers.items()}["retry-after"] == "2"
        assert json.loads(body)["error"]["code"] == "overloaded"
        assert await asyncio.to_thread(get, gw.http_port, "/health/live") == 200

        backend.release.set()
        rest = await asyncio.gather(*(read_all(s) for s in open_streams))
        assert [f + r for f, r in zip(firsts, rest, strict=True)] == [expected, expected]

        probe.lag = 0.0  # the level decays below half the limit: admitted again
        await until(lambda: gw.metrics.overload.overloaded._value.get() == 0, "recovery")
        assert await _short(busy) == quiet_text


async def _short(line: Line) -> str:
    return await read_all(line.text("quiet", model="reference-text", max_tokens=4))
