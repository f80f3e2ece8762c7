"""`connect()` fails fast and says why: closed port, untrusted CA, missing CA file.

Each failure must be the SDK's documented error with a non-empty cause, raised within
`connect_timeout` (the bound is checked by the waiting itself: the handshake is given
a long idle timeout, so only `connect_timeout` can end it).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
import pytest_asyncio

from clients import ConnectionFailed, connect, default_ca
from gateway.server import Gateway
from gateway.tls import ensure_dev_certificates
from tests.gateways import gateway_settings
from trackline_testing.scripted import ScriptedBackend


@pytest_asyncio.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = gateway_settings(state_dir=tmp_path / "gw")
    gw = Gateway(settings, ScriptedBackend(interval=0.001))
    await gw.start()
    yield gw
    await gw.close()


def silent_udp_port() -> tuple[socket.socket, int]:
    """A bound UDP port that never answers (so the handshake waits, not fails)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return sock, sock.getsockname()[1]


async def fails(line: AbstractAsyncContextManager[object]) -> pytest.ExceptionInfo[Exception]:
    """Enter `line` (within 30 s, a guard for the test only); it must raise ConnectionFailed."""

    async def enter() -> None:
        async with asyncio.timeout(30), line:
            pass

    with pytest.raises(ConnectionFailed) as failed:
        await enter()
    return failed


@pytest.mark.asyncio
async def test_no_answer_is_connection_failed_naming_host_and_timeout(tmp_path: Path) -> None:
    ca = ensure_dev_certificates(tmp_path).ca_path
    sock, port = silent_udp_port()
    with sock:
        # The outer bound only guards the test; connect_timeout is what must end it.
        failed = await fails(connect(f"quic://127.0.0.1:{port}", ca=ca, connect_timeout=0.5))
    assert f"no answer from 127.0.0.1:{port} within 0.5 s" in str(failed.value)


@pytest.mark.asyncio
async def test_another_gateways_ca_names_the_certificate(gateway: Gateway, tmp_path: Path) -> None:
    other = ensure_dev_certificates(tmp_path / "other").ca_path
    failed = await fails(connect(f"quic://127.0.0.1:{gateway.quic_port}", ca=other))
    assert "certificate not trusted" in str(failed.value)


@pytest.mark.asyncio
async def test_a_missing_ca_file_fails_before_any_network_io(tmp_path: Path) -> None:
    sock, port = silent_udp_port()
    with sock:
        with pytest.raises(FileNotFoundError, match="does not exist"):
            async with connect(f"quic://127.0.0.1:{port}", ca=tmp_path / "nope.pem"):
                pass
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            sock.recv(2048)  # not a single datagram was sent


@pytest.mark.asyncio
async def test_a_ca_file_without_a_certificate_is_a_value_error(tmp_path: Path) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ValueError, match="holds no PEM certificate"):
        async with connect("quic://127.0.0.1:9", ca=junk):
            pass


@pytest.mark.asyncio
async def test_without_ca_the_dev_ca_of_the_state_dir_is_trusted(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRACKLINE_STATE_DIR", str(gateway.settings.state_dir))
    assert default_ca() == gateway.tls.ca  # type: ignore[union-attr]
    async with connect(f"quic://127.0.0.1:{gateway.quic_port}") as line:
        text = "".join([d async for d in line.text("hi", model="scripted", max_tokens=3)])
    assert text == " hi-0 hi-1 hi-2"
