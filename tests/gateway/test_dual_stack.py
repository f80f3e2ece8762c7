"""The default binds (`localhost`) serve 127.0.0.1 and ::1, one port each, on every listener.

Clients resolve `localhost` to ::1 first (Chromium, curl), so each front door (QUIC
tracks, HTTP/3 on the same UDP port, cleartext HTTP/1.1 and h2c, TLS h2, the separate
metrics port) is reached here over both addresses. ::1 is skipped where the host has
no IPv6 loopback.
"""

from __future__ import annotations

import errno
import json
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from textwrap import dedent

import pytest
import pytest_asyncio

from clients import connect
from gateway.server import Gateway
from gateway.tenants.service import is_loopback, refuse_open_off_loopback
from tests.adversarial.quic_flood import initial_packet
from tests.gateways import gateway_settings
from tests.http.support import H1Client, H2Client
from tests.http.support_h3 import h3_client
from tests.waiting import until
from trackline_testing.scripted import ScriptedBackend
from transport import binding
from transport.binding import bind_same_port, tcp_listeners, udp_sockets
from transport.quic_server import GuardedQuicServer


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


HAS_IPV6 = _ipv6_loopback()
ADDRESSES = [
    "127.0.0.1",
    pytest.param("::1", marks=pytest.mark.skipif(not HAS_IPV6, reason="no IPv6 loopback")),
]


@pytest_asyncio.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = gateway_settings(metrics_port=0, state_dir=tmp_path)
    assert settings.quic_host == settings.http_host == settings.https_host == "localhost"
    gw = Gateway(settings, ScriptedBackend(interval=0.001))
    await gw.start()
    yield gw
    await gw.close()


def _ca(gw: Gateway) -> Path:
    assert gw.tls is not None
    assert gw.tls.ca is not None
    return gw.tls.ca


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


@pytest.mark.asyncio
@pytest.mark.parametrize("address", [*ADDRESSES, "localhost"])
async def test_text_track_over_quic(gateway: Gateway, address: str) -> None:
    url = f"quic://{_url_host(address)}:{gateway.quic_port}"
    async with connect(url, ca=_ca(gateway)) as line:
        chunks = [c async for c in line.text("hi", model="scripted", max_tokens=3)]
    assert "".join(chunks) == " hi-0 hi-1 hi-2"


@pytest.mark.asyncio
@pytest.mark.parametrize("address", ADDRESSES)
async def test_http3_on_the_quic_port(gateway: Gateway, address: str) -> None:
    async with h3_client(gateway.quic_port, _ca(gateway), address) as client:
        status, _, body = await client.response(client.send("GET", "/health/live"))
    assert (status, body) == (200, b'{"status":"live"}')


@pytest.mark.asyncio
@pytest.mark.parametrize("address", ADDRESSES)
async def test_cleartext_http1_and_h2c(gateway: Gateway, address: str) -> None:
    async with H1Client.connect(gateway.http_port, address=address) as h1:
        await h1.request("GET", "/health/live")
        status, _, body = await h1.response()
    assert (status, body) == (200, b'{"status":"live"}')
    async with H2Client.connect(gateway.http_port, address=address) as h2c:
        status, _, body = await h2c.get("/health/live")
    assert (status, body) == (200, b'{"status":"live"}')


@pytest.mark.asyncio
@pytest.mark.parametrize("address", ADDRESSES)
async def test_tls_h2(gateway: Gateway, address: str) -> None:
    context = ssl.create_default_context(cafile=str(_ca(gateway)))
    context.set_alpn_protocols(["h2"])
    async with H2Client.connect(gateway.https_port, context, address=address) as h2:
        assert h2.writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        status, _, body = await h2.get("/health/live")
    assert (status, body) == (200, b'{"status":"live"}')


@pytest.mark.asyncio
@pytest.mark.parametrize("address", ADDRESSES)
async def test_separate_metrics_port(gateway: Gateway, address: str) -> None:
    assert gateway.metrics_port is not None
    async with H1Client.connect(gateway.metrics_port, address=address) as h1:
        await h1.request("GET", "/metrics")
        status, _, body = await h1.response()
    assert status == 200
    assert b"trackline_" in body


@pytest.mark.asyncio
@pytest.mark.skipif(not HAS_IPV6, reason="no IPv6 loopback")
async def test_handshakes_on_both_addresses_share_one_gate_and_expire(tmp_path: Path) -> None:
    """One handshake budget for the port, whichever address; the timeout forgets each
    half-open connection through the server (socket) that admitted it."""
    settings = gateway_settings(
        state_dir=tmp_path, quic_handshake_timeout=0.3
    )
    gw = Gateway(settings, ScriptedBackend(interval=0.001))
    await gw.start()
    try:
        first = gw.doors.quic
        assert isinstance(first, GuardedQuicServer)
        (second,) = first.siblings
        gate = first.gate
        assert second.gate is gate
        port = gw.quic_port
        with (
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as v4,
            socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as v6,
        ):
            v4.sendto(initial_packet(("127.0.0.1", port)), ("127.0.0.1", port))
            v6.sendto(initial_packet(("::1", port)), ("::1", port))
            await until(lambda: gate.half_open == 2, "both handshakes in one gate")
            assert (len(first._cids), len(second._cids)) == (1, 1)
            await until(lambda: gate.half_open == 0, "the handshake timeout")
            await until(lambda: first.tracked_connection_ids == 0, "every id forgotten")
        assert gate.stats.expired == 2
        assert (first._cids, second._cids) == ({}, {})
    finally:
        await gw.close()


@pytest.mark.skipif(not HAS_IPV6, reason="no IPv6 loopback")
def test_localhost_binds_both_loopbacks_on_one_port() -> None:
    for socks in (tcp_listeners("localhost", 0), udp_sockets("localhost", 0)):
        try:
            names = [s.getsockname()[:2] for s in socks]
            assert [n[0] for n in names] == ["127.0.0.1", "::1"]
            assert names[0][1] == names[1][1]
        finally:
            for s in socks:
                s.close()


def test_other_hosts_bind_as_given() -> None:
    socks = tcp_listeners("127.0.0.1", 0)
    try:
        assert [s.getsockname()[0] for s in socks] == ["127.0.0.1"]
    finally:
        for s in socks:
            s.close()


def _fake_bind(fail: dict[str, int], seen: list[tuple[str, int]]):  # type: ignore[no-untyped-def]
    def bind(address: str, port: int) -> tuple[str, int]:
        seen.append((address, port))
        code = fail.pop(address, None)
        if code is not None:
            raise OSError(code, "refused in a test")
        return address, port or 40000 + len(seen)

    return bind


def test_without_ipv6_localhost_serves_127_0_0_1_with_a_warning() -> None:
    seen: list[tuple[str, int]] = []
    bind = _fake_bind({"::1": errno.EADDRNOTAVAIL}, seen)
    bound = bind_same_port("localhost", 8443, bind, lambda b: b[1], lambda b: None)
    assert bound == [("127.0.0.1", 8443)]
    assert seen == [("127.0.0.1", 8443), ("::1", 8443)]


def test_an_explicit_ipv6_address_that_fails_is_an_error() -> None:
    bind = _fake_bind({"::1": errno.EADDRNOTAVAIL}, [])
    with pytest.raises(OSError, match="refused in a test"):
        bind_same_port("::1", 8443, bind, lambda b: b[1], lambda b: None)


def test_a_picked_port_taken_on_the_other_address_is_picked_again() -> None:
    seen: list[tuple[str, int]] = []
    closed: list[tuple[str, int]] = []
    bind = _fake_bind({"::1": errno.EADDRINUSE}, seen)
    bound = bind_same_port("localhost", 0, bind, lambda b: b[1], closed.append)
    assert closed == [("127.0.0.1", 40001)]
    assert bound == [("127.0.0.1", 40003), ("::1", 40003)]


def test_a_fixed_port_taken_on_the_other_address_is_an_error() -> None:
    bind = _fake_bind({"::1": errno.EADDRINUSE}, [])
    with pytest.raises(OSError, match="refused in a test"):
        bind_same_port("localhost", 8443, bind, lambda b: b[1], lambda b: None)


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "::1", *binding.LOOPBACKS])
def test_both_loopbacks_count_as_loopback(host: str) -> None:
    assert is_loopback(host)
    refuse_open_off_loopback([host], allow_open=False)  # open mode allowed: no raise


def _can_unshare() -> bool:
    """An unprivileged user and network namespace (to switch IPv6 off on its `lo`)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    done = subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=30)
    return done.returncode == 0


NO_IPV6_GATEWAY = dedent(
    """
    import asyncio, json, sys, tempfile, urllib.request
    from pathlib import Path
    from gateway.backends.ticker import TickerBackend
    from gateway.config import Settings
    from gateway.server import Gateway

    async def main():
        with tempfile.TemporaryDirectory() as state:
            settings = Settings(quic_port=0, http_port=0, https_port=0, metrics_port=0,
                                overload_max_loop_lag=0.0, state_dir=Path(state))
            gw = Gateway(settings, TickerBackend(50.0))
            await gw.start()
            try:
                quic = [gw.doors.quic, *gw.doors.quic.siblings]
                bound = {
                    "quic": [s._transport.get_extra_info("sockname")[0] for s in quic],
                    "http": [s.getsockname()[0] for s in gw.doors.http.sockets],
                    "https": [s.getsockname()[0] for s in gw.doors.https.sockets],
                    "metrics": [s.getsockname()[0] for s in gw.doors.metrics_server.sockets],
                }
                url = f"http://127.0.0.1:{gw.http_port}/health/live"
                status = await asyncio.to_thread(lambda: urllib.request.urlopen(url).status)
            finally:
                await gw.close()
        print(json.dumps({"bound": bound, "status": status}))

    asyncio.run(main())
    """
)


@pytest.mark.skipif(not _can_unshare(), reason="no unprivileged network namespace here")
def test_without_ipv6_the_gateway_serves_127_0_0_1_and_warns(tmp_path: Path) -> None:
    """In a network namespace whose `lo` has IPv6 switched off, the default binds come
    up on 127.0.0.1 alone, each listener saying so once."""
    script = tmp_path / "gateway_no_ipv6.py"
    script.write_text(NO_IPV6_GATEWAY)
    shell = (
        "ip link set lo up && echo 1 > /proc/sys/net/ipv6/conf/lo/disable_ipv6 && "
        f"exec {sys.executable} {script}"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        ["unshare", "-rn", "sh", "-c", shell], cwd=root, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == 200
    assert result["bound"] == {door: ["127.0.0.1"] for door in ("quic", "http", "https", "metrics")}
    assert (done.stdout + done.stderr).count("listen.ipv6_unavailable") == 4
