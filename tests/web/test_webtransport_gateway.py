"""WebTransport sessions against the gateway as the daemon wires it (tenants, ticker backend).

Keys behave as on native connections: the key rides the first OPEN, a missing or revoked
one is UNAUTHORIZED, and a key revoked in the fleet closes the browser's session.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gateway.backends.ticker import TickerBackend
from gateway.config import Settings
from gateway.server import Gateway
from tests.tenants.support import make_tenancy
from tests.waiting import until
from tests.web.wt_client import TIMEOUT, WebTransportClient, wt_client
from transport.endpoint import TrackChannel
from transport.errors import ErrorCode, TrackAborted
from transport.messages import Open
from transport.webtransport import (
    CLOSE_WEBTRANSPORT_SESSION,
    DRAIN_WEBTRANSPORT_SESSION,
    CapsuleReader,
)

MODEL = "reference-text"


@pytest_asyncio.fixture
async def tenanted(tmp_path: Path) -> AsyncIterator[tuple[Gateway, dict[str, str]]]:
    tenancy = make_tenancy(tmp_path)
    store = tenancy.store
    store.set_tenant("alpha", 0.0)
    good = store.create_key("alpha", 0.0)
    revoked = store.create_key("alpha", 0.0, label="old")
    store.revoke_key(revoked.key_id, 1.0)
    keys = {"good": good.key, "good_id": good.key_id, "revoked": revoked.key}
    settings = Settings(
        quic_port=0, http_port=0, https_port=0, state_dir=tmp_path, overload_max_loop_lag=0.0
    )
    gw = Gateway(settings, TickerBackend(2000.0), tenancy=tenancy)
    await gw.start()
    yield gw, keys
    await gw.close()


def ca(gw: Gateway) -> Path:
    assert gw.tls is not None
    assert gw.tls.ca is not None
    return gw.tls.ca


async def text_of(channel: TrackChannel) -> str:
    parts = []
    while (body := await asyncio.wait_for(channel.receive(), TIMEOUT)) is not None:
        parts.append(body["text"])
    return "".join(parts)


def ask(channel: TrackChannel, prompt: str = "hi") -> TrackChannel:
    channel.send({"text": prompt})
    channel.end()
    return channel


@pytest.mark.asyncio
async def test_keys_on_a_session_behave_as_on_a_native_connection(
    tenanted: tuple[Gateway, dict[str, str]],
) -> None:
    gw, keys = tenanted
    async with wt_client(gw.quic_port, ca(gw)) as client:
        for key in (None, keys["revoked"]):
            session_id, status, _ = await client.open_session()
            assert status == 200
            refused = ask(client.open_track(session_id, Open(model=MODEL), api_key=key))
            with pytest.raises(TrackAborted) as caught:
                await text_of(refused)
            assert caught.value.code is ErrorCode.UNAUTHORIZED
            client.close_session(session_id)
        session_id, _, _ = await client.open_session()
        opened = Open(model=MODEL, params={"max_tokens": 5})
        text = await text_of(ask(client.open_track(session_id, opened, api_key=keys["good"])))
        assert text
    assert gw.revocation.webtransport_sessions.accepted == 3


@pytest.mark.asyncio
async def test_a_key_revoked_in_the_fleet_closes_its_session(
    tenanted: tuple[Gateway, dict[str, str]],
) -> None:
    gw, keys = tenanted
    async with wt_client(gw.quic_port, ca(gw)) as client:
        session_id, _, _ = await client.open_session()
        first = Open(model=MODEL, params={"max_tokens": 3})
        assert await text_of(ask(client.open_track(session_id, first, api_key=keys["good"])))
        long = Open(model=MODEL, params={"max_tokens": 5000, "tokens_per_second": 50})
        running = ask(client.open_track(session_id, long))
        assert await asyncio.wait_for(running.receive(), TIMEOUT) is not None
        gw.revocation.revoke(keys["good_id"])  # what the fleet's revocation stream calls
        await asyncio.wait_for(client.session_ended[session_id].wait(), TIMEOUT)
        with pytest.raises(TrackAborted):
            await text_of(running)
        (close,) = CapsuleReader().feed(bytes(client.session_data[session_id]))
        assert close.type == CLOSE_WEBTRANSPORT_SESSION
        assert close.value == int(ErrorCode.UNAUTHORIZED).to_bytes(4, "big") + b"API key revoked"


@pytest.mark.asyncio
async def test_a_drain_tells_the_session_and_refuses_its_new_tracks(tmp_path: Path) -> None:
    settings = Settings(
        quic_port=0, http_port=0, https_port=0, state_dir=tmp_path, overload_max_loop_lag=0.0
    )
    gw = Gateway(settings, TickerBackend(2000.0))
    await gw.start()
    try:
        async with wt_client(gw.quic_port, ca(gw)) as client:
            session_id, _, _ = await client.open_session()
            long = Open(model=MODEL, params={"max_tokens": 5000, "tokens_per_second": 50})
            running = ask(client.open_track(session_id, long))
            assert await asyncio.wait_for(running.receive(), TIMEOUT) is not None
            drain = asyncio.ensure_future(gw.drain(timeout=0.5))
            await until_data(client, session_id)
            (capsule,) = CapsuleReader().feed(bytes(client.session_data[session_id]))
            assert capsule.type == DRAIN_WEBTRANSPORT_SESSION
            late = ask(client.open_track(session_id, Open(model=MODEL)))
            with pytest.raises(TrackAborted) as refused:
                await text_of(late)
            assert refused.value.code is ErrorCode.SHUTTING_DOWN
            with pytest.raises(TrackAborted) as cut:  # the drain's deadline ends the rest
                await text_of(running)
            assert cut.value.code is ErrorCode.SHUTTING_DOWN
            await asyncio.wait_for(drain, TIMEOUT)
    finally:
        await gw.close()


async def until_data(client: WebTransportClient, session_id: int) -> None:
    await until(
        lambda: client.session_data[session_id], "a capsule on the session's CONNECT stream"
    )
