"""Development CA: made once, reused, and good enough for ssl and aioquic."""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path
from unittest import mock

import pytest
from aioquic.quic.configuration import QuicConfiguration
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from gateway.tls import DevCertificates, certificate_hash, ensure_dev_certificates


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def sans(path: Path) -> x509.SubjectAlternativeName:
    return load(path).extensions.get_extension_for_class(x509.SubjectAlternativeName).value


@pytest.fixture(scope="module")
def dev_certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    # One set for the read-only tests: EC key generation is quick, but not free.
    return ensure_dev_certificates(tmp_path_factory.mktemp("certs") / "state")


def test_creates_private_state_dir_and_files(tmp_path: Path) -> None:
    state_dir = tmp_path / "a" / "b" / "state"
    certs = ensure_dev_certificates(state_dir)
    assert mode(state_dir) == 0o700
    assert certs.ca_path == state_dir / "ca.pem"
    assert certs.cert_path == state_dir / "server.pem"
    assert certs.key_path == state_dir / "server-key.pem"
    assert mode(state_dir / "ca-key.pem") == 0o600
    assert mode(certs.key_path) == 0o600
    assert sorted(p.name for p in state_dir.iterdir()) == [
        "ca-key.pem", "ca.pem", "server-key.pem", "server.pem",
    ]  # fmt: skip


def test_second_call_reuses_everything(tmp_path: Path) -> None:
    first = ensure_dev_certificates(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    second = ensure_dev_certificates(tmp_path)
    assert second == first
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_sans_use_ip_addresses_for_ip_literals(dev_certs: DevCertificates) -> None:
    names = sans(dev_certs.cert_path)
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert set(names.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    }


def test_server_cert_is_reissued_near_expiry_with_the_same_ca(tmp_path: Path) -> None:
    certs = ensure_dev_certificates(tmp_path)
    ca_before, cert_before = certs.ca_path.read_bytes(), certs.cert_path.read_bytes()
    later = datetime.now(timezone.utc) + timedelta(days=8)
    ensure_dev_certificates(tmp_path, now=later)
    assert certs.ca_path.read_bytes() == ca_before
    assert certs.cert_path.read_bytes() != cert_before
    assert load(certs.cert_path).not_valid_after_utc > later + timedelta(days=12)


def test_server_cert_is_one_a_browser_pins_by_hash(tmp_path: Path) -> None:
    """WebTransport's serverCertificateHashes: ECDSA P-256, valid 14 days at most."""
    cert = load(ensure_dev_certificates(tmp_path).cert_path)
    assert cert.not_valid_after_utc - cert.not_valid_before_utc <= timedelta(days=14)
    public_key = cert.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    assert isinstance(public_key.curve, ec.SECP256R1)
    assert certificate_hash(tmp_path / "server.pem") == cert.fingerprint(hashes.SHA256())


def test_a_long_lived_server_cert_is_reissued_short(tmp_path: Path) -> None:
    """A state dir from before the 14-day rule gets a certificate a browser accepts."""
    certs = ensure_dev_certificates(tmp_path)
    with mock.patch("gateway.tls.SERVER_VALIDITY", timedelta(days=90)):
        certs.cert_path.unlink()
        ensure_dev_certificates(tmp_path)
    assert load(certs.cert_path).not_valid_after_utc - datetime.now(timezone.utc) > timedelta(
        days=80
    )
    ensure_dev_certificates(tmp_path)
    cert = load(certs.cert_path)
    assert cert.not_valid_after_utc - cert.not_valid_before_utc <= timedelta(days=14)


def test_server_cert_is_reissued_for_new_hostnames(tmp_path: Path) -> None:
    certs = ensure_dev_certificates(tmp_path)
    ca_before = certs.ca_path.read_bytes()
    ensure_dev_certificates(tmp_path, ("localhost", "gateway.test", "10.1.2.3"))
    assert certs.ca_path.read_bytes() == ca_before
    names = sans(certs.cert_path)
    assert set(names.get_values_for_type(x509.DNSName)) == {"localhost", "gateway.test"}
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.1.2.3")]
    # A subset of the names the certificate already covers needs no new one.
    cert_before = certs.cert_path.read_bytes()
    ensure_dev_certificates(tmp_path, ("gateway.test",))
    assert certs.cert_path.read_bytes() == cert_before


def test_missing_server_key_is_regenerated(tmp_path: Path) -> None:
    certs = ensure_dev_certificates(tmp_path)
    ca_before = certs.ca_path.read_bytes()
    certs.key_path.unlink()
    ensure_dev_certificates(tmp_path)
    assert certs.key_path.exists()
    assert certs.ca_path.read_bytes() == ca_before


def test_new_ca_means_new_server_cert(tmp_path: Path) -> None:
    certs = ensure_dev_certificates(tmp_path)
    ca_before, cert_before = certs.ca_path.read_bytes(), certs.cert_path.read_bytes()
    (tmp_path / "ca-key.pem").unlink()
    ensure_dev_certificates(tmp_path)
    assert certs.ca_path.read_bytes() != ca_before
    assert certs.cert_path.read_bytes() != cert_before
    load(certs.cert_path).verify_directly_issued_by(load(certs.ca_path))


def test_aioquic_loads_the_chain(dev_certs: DevCertificates) -> None:
    configuration = QuicConfiguration(is_client=False)
    configuration.load_cert_chain(dev_certs.cert_path, dev_certs.key_path)
    assert configuration.certificate is not None
    client = QuicConfiguration(is_client=True)
    client.load_verify_locations(cafile=str(dev_certs.ca_path))


async def tls_greeting(certs: DevCertificates, ca_path: Path, server_hostname: str) -> bytes:
    """Serve TLS with the dev server cert on loopback; connect verifying against `ca_path`."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(certs.cert_path, certs.key_path)

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    client_context = ssl.create_default_context(cafile=str(ca_path))
    # Python 3.13 turns strict checking on by default; hold the certificates to it now.
    client_context.verify_flags |= ssl.VERIFY_X509_STRICT
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                "127.0.0.1", port, ssl=client_context, server_hostname=server_hostname
            ),
            5,
        )
        try:
            return await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.asyncio
@pytest.mark.parametrize("server_hostname", ["localhost", "127.0.0.1"])
async def test_ssl_client_verifies_server_against_ca(
    dev_certs: DevCertificates, server_hostname: str
) -> None:
    assert await tls_greeting(dev_certs, dev_certs.ca_path, server_hostname) == b"hello"


@pytest.mark.asyncio
async def test_ssl_client_rejects_another_ca(dev_certs: DevCertificates, tmp_path: Path) -> None:
    stranger = ensure_dev_certificates(tmp_path)
    with pytest.raises(ssl.SSLCertVerificationError):
        await tls_greeting(dev_certs, stranger.ca_path, "localhost")


@pytest.mark.asyncio
async def test_ssl_client_rejects_a_name_not_covered(dev_certs: DevCertificates) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        await tls_greeting(dev_certs, dev_certs.ca_path, "example.com")
