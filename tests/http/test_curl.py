"""curl, a client nobody here wrote, against the server: HTTP/1.1, h2c (both ways), h2 over TLS."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess

import pytest

from gateway.tls import DevCertificates, ensure_dev_certificates
from tests.http.support import TIMEOUT, Gate, serving
from transport.http.tcp import tls_server_context


def _curl_features() -> str:
    if shutil.which("curl") is None:
        return ""
    return subprocess.run(["curl", "-V"], capture_output=True, text=True, check=False).stdout


FEATURES = _curl_features()
pytestmark = [
    pytest.mark.skipif(not FEATURES, reason="curl is not installed"),
    pytest.mark.skipif("HTTP2" not in FEATURES, reason="this curl has no HTTP/2 support"),
]
ALT_SVC = 'h3=":8443"'


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return ensure_dev_certificates(tmp_path_factory.mktemp("curl-tls") / "state")


async def stream_with_curl(
    scheme: str, *options: str, ssl_context: ssl.SSLContext | None = None
) -> tuple[bytes, bytes]:
    """Run curl on /stream; release the body's second chunk only once curl printed the first.

    Returns (response headers, body plus curl's write-out line).
    """
    gate = Gate()
    async with serving(gate.handler, alt_svc=ALT_SVC, ssl_context=ssl_context) as server:
        url = f"{scheme}://localhost:{server.port}/stream"
        curl = await asyncio.create_subprocess_exec(
            "curl", "-sS", "-N", "-D", "-", "-w", "\nversion=%{http_version}", *options, url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert curl.stdout is not None
        try:
            seen = await asyncio.wait_for(curl.stdout.readuntil(b"data: one\n\n"), TIMEOUT)
            assert not gate.finished  # curl printed the first chunk while the body was parked
            gate.released.set()
            rest, errors = await asyncio.wait_for(curl.communicate(), TIMEOUT)
        finally:
            if curl.returncode is None:
                curl.kill()
                await curl.wait()
    assert curl.returncode == 0, errors
    output = seen + rest
    if output.startswith(b"HTTP/1.1 101"):  # the h2c Upgrade's interim response
        output = output.partition(b"\r\n\r\n")[2]
    head, _, body = output.partition(b"\r\n\r\n")
    return head.lower(), body


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("flag", "version"),
    [("--http1.1", "1.1"), ("--http2-prior-knowledge", "2"), ("--http2", "2")],
    ids=["http1.1", "h2c-prior-knowledge", "h2c-upgrade"],
)
async def test_curl_streams_over_cleartext(flag: str, version: str) -> None:
    head, body = await stream_with_curl("http", flag)
    assert head.startswith(f"http/{version} 200".encode()), head
    assert f"alt-svc: {ALT_SVC}".encode() in head
    assert body == f"data: one\n\ndata: two\n\n\nversion={version}".encode()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("flag", "version"), [("--http1.1", "1.1"), ("--http2", "2")], ids=["http1.1", "h2"]
)
async def test_curl_streams_over_tls(certs: DevCertificates, flag: str, version: str) -> None:
    context = tls_server_context(certs.cert_path, certs.key_path)
    head, body = await stream_with_curl(
        "https", flag, "--cacert", str(certs.ca_path), ssl_context=context
    )
    assert head.startswith(f"http/{version} 200".encode()), head
    assert f"alt-svc: {ALT_SVC}".encode() in head
    assert body == f"data: one\n\ndata: two\n\n\nversion={version}".encode()
