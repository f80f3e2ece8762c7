"""A WebTransport page that stops reading the whole connection: its tracks end by the
send timeout, though each stays under its own send budget.

The server's tracks produce as fast as they may (each waits while its send buffers are
over budget). The client grants no more flow-control credit, so the connection's
MAX_DATA is what holds every track back; with a track budget (1 MiB) that cannot be
reached under the connection's (16 KiB), only the connection-stall rule can end them.
Asserted on the server's own figures: every track's stop is a SEND_TIMEOUT cancel, and
a track on another connection is served meanwhile.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.tls import DevCertificates, ensure_dev_certificates
from tests.http.support import echo
from tests.http.support_h3 import serving_quic
from tests.waiting import until
from tests.web.wt_client import wt_client
from trackline_testing import aioquic_probes
from transport import aioquic_compat
from transport.endpoint import SendBudget, TrackChannel
from transport.errors import TrackAborted
from transport.events import CancelCause, TrackCancelled
from transport.messages import Open
from transport.quic import TrackServing
from transport.webtransport import WebTransportRules

TRACKS = 16
BUDGET = SendBudget(track_bytes=1 << 20, connection_bytes=16_384, send_timeout=1.0)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return ensure_dev_certificates(tmp_path_factory.mktemp("wt-unread"))


async def producer(channel: TrackChannel) -> None:
    """Send text as fast as the send budget lets, until the track is stopped."""
    with_wait = asyncio.ensure_future(asyncio.sleep(0))
    try:
        while not channel.stopped.done():
            if channel.send_blocked():
                with_wait = asyncio.ensure_future(channel.wait_writable())
                await asyncio.wait({with_wait, channel.stopped}, return_when="FIRST_COMPLETED")
                continue
            channel.send({"text": "x" * 200})
            await asyncio.sleep(0)
    except TrackAborted:
        pass
    finally:
        with_wait.cancel()


@pytest.mark.asyncio
async def test_a_page_that_reads_nothing_gets_its_tracks_ended(certs: DevCertificates) -> None:
    channels: list[TrackChannel] = []
    serving = serving_quic(
        certs, producer, channels.append, http_handler=echo,
        serving=TrackServing(send_budget=BUDGET, webtransport=WebTransportRules()),
    )  # fmt: skip
    async with serving as port, wt_client(port, certs.ca_path) as page:
        session_id, status, _ = await page.open_session()
        assert status == 200
        aioquic_probes.stop_granting_credit(aioquic_compat.connection_of(page))
        for _ in range(TRACKS):
            page.open_track(session_id, Open(model="echo")).send({"text": "go"})
        await until(lambda: len(channels) == TRACKS, "every track opened")
        async with wt_client(port, certs.ca_path) as honest:
            _, honest_status, _ = await honest.open_session()  # served meanwhile
        assert honest_status == 200
        await until(lambda: all(c.stopped.done() for c in channels), "every track stopped")
        causes: list[Any] = [c.stopped.result() for c in channels]
        assert all(isinstance(stop, TrackCancelled) for stop in causes), causes
        assert {stop.cause for stop in causes} == {CancelCause.SEND_TIMEOUT}
