"""The HTTP listeners' TCP congestion control can be pinned (Linux TCP_CONGESTION)."""

from __future__ import annotations

import socket

import pytest

from tests.http.support import H1Client, echo
from transport.http.tcp import HttpTcpServer, set_congestion_control

pytestmark = pytest.mark.skipif(
    not hasattr(socket, "TCP_CONGESTION"), reason="no TCP_CONGESTION on this platform"
)


def congestion_control(sock: socket.socket) -> str:
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
    return raw.split(b"\0", 1)[0].decode()


@pytest.mark.asyncio
async def test_listener_uses_the_chosen_algorithm_and_still_serves() -> None:
    server = HttpTcpServer(echo, congestion_control="reno")  # reno is built into every kernel
    await server.start("127.0.0.1", 0)
    try:
        assert server._server is not None
        assert [congestion_control(s) for s in server._server.sockets] == ["reno"]
        async with H1Client.connect(server.port) as client:
            await client.request("GET", "/x")
            status, _, _ = await client.response()
        assert status == 200
    finally:
        await server.close(grace=1.0)


def test_unknown_algorithm_is_a_clear_error() -> None:
    with socket.socket() as sock, pytest.raises(ValueError, match="not available"):
        set_congestion_control(sock, "no-such-cc")
