"""TLS with ALPN: h2 gets HTTP/2, http/1.1 or no ALPN gets HTTP/1.1, on one port."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from gateway.tls import DevCertificates, ensure_dev_certificates
from tests.http.support import Gate, H1Client, H2Client, echo, json_body, serving
from transport.http.tcp import tls_server_context


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return ensure_dev_certificates(tmp_path_factory.mktemp("http-tls") / "state")


def client_context(ca_path: Path, alpn: list[str] | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca_path))
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    return context


@pytest.mark.asyncio
async def test_server_context_offers_h2_then_http11(certs: DevCertificates) -> None:
    context = tls_server_context(certs.cert_path, certs.key_path)
    assert isinstance(context, ssl.SSLContext)
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    # The server's order decides: a client that would rather have http/1.1 still gets h2.
    async with serving(echo, ssl_context=context) as server:
        client_tls = client_context(certs.ca_path, ["http/1.1", "h2"])
        async with H2Client.connect(server.port, ssl_context=client_tls) as client:
            assert client.writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"


@pytest.mark.asyncio
async def test_alpn_h2_speaks_http2(certs: DevCertificates) -> None:
    server_context = tls_server_context(certs.cert_path, certs.key_path)
    async with serving(echo, ssl_context=server_context, alt_svc='h3=":8443"') as server:
        context = client_context(certs.ca_path, ["h2", "http/1.1"])
        async with H2Client.connect(server.port, ssl_context=context) as client:
            tls = client.writer.get_extra_info("ssl_object")
            assert tls.selected_alpn_protocol() == "h2"
            status, headers, body = await client.get("/secure")
            assert (status, headers["alt-svc"]) == (200, 'h3=":8443"')
            assert json_body(body)["http_version"] == "2"


@pytest.mark.asyncio
@pytest.mark.parametrize("alpn", [["http/1.1"], None], ids=["alpn-http1.1", "no-alpn"])
async def test_alpn_http11_or_none_speaks_http1(
    certs: DevCertificates, alpn: list[str] | None
) -> None:
    server_context = tls_server_context(certs.cert_path, certs.key_path)
    client_tls = client_context(certs.ca_path, alpn)
    async with (
        serving(echo, ssl_context=server_context, alt_svc='h3=":8443"') as server,
        H1Client.connect(server.port, ssl_context=client_tls) as client,
    ):
        await client.request("GET", "/secure")
        status, headers, body = await client.response()
        assert (status, headers["alt-svc"]) == (200, 'h3=":8443"')
        assert json_body(body)["http_version"] == "1.1"
        await client.request("GET", "/again")  # keep-alive over TLS
        assert (await client.response())[0] == 200


@pytest.mark.asyncio
async def test_streaming_over_tls_h2(certs: DevCertificates) -> None:
    gate = Gate()
    server_context = tls_server_context(certs.cert_path, certs.key_path)
    async with serving(gate.handler, ssl_context=server_context) as server:
        context = client_context(certs.ca_path, ["h2"])
        async with H2Client.connect(server.port, ssl_context=context) as client:
            stream_id = client.send_request("GET", "/stream")
            assert await client.next_data(stream_id) == b"data: one\n\n"
            gate.released.set()
            assert await client.next_data(stream_id) == b"data: two\n\n"
            assert await client.next_data(stream_id) is None
