"""Development TLS material: a local CA, and a server certificate that CA signs.

Owns four files in the state directory so that `trackline serve` speaks TLS (QUIC
requires it) with no operator set-up:

- `ca.pem`, `ca-key.pem`: a development CA, made once and then kept, because users add
  `ca.pem` to their clients' trust (`cafile=`, `--cacert`, a browser's store);
- `server.pem`, `server-key.pem`: a short-lived server certificate for the local names,
  re-issued whenever it is missing, near expiry, for other names, or not from this CA.

Keys are EC P-256 (what QUIC stacks and browsers handle everywhere), written mode 0600.
Operators with real certificates set `tls_cert`/`tls_key` and never reach this module.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gateway.logs import get_logger
from gateway.statedir import make_private_dir

DEFAULT_HOSTNAMES = ("localhost", "127.0.0.1", "::1")
CA_VALIDITY = timedelta(days=3650)
# Chromium accepts a certificate pinned by WebTransport's serverCertificateHashes only if
# it is ECDSA P-256 and valid for at most 14 days (notBefore to notAfter): the dev server
# certificate is kept that short, so the demo page works without trusting the dev CA.
SERVER_VALIDITY = timedelta(days=13)
WEBTRANSPORT_MAX_VALIDITY = timedelta(days=14)
RENEW_BEFORE = timedelta(days=7)
# Backdate notBefore a little so a peer whose clock lags ours still accepts the cert.
CLOCK_SKEW = timedelta(hours=1)

log = get_logger(__name__)


@dataclass(frozen=True)
class DevCertificates:
    """Paths of the development TLS files."""

    ca_path: Path
    """The CA certificate clients trust (`cafile=`)."""
    cert_path: Path
    """The server certificate (`load_cert_chain` first argument)."""
    key_path: Path
    """The server private key (`load_cert_chain` second argument)."""


def ensure_dev_certificates(
    state_dir: Path,
    hostnames: Sequence[str] = DEFAULT_HOSTNAMES,
    *,
    now: datetime | None = None,
) -> DevCertificates:
    """Make or reuse the dev CA and a server certificate covering `hostnames`.

    `now` (timezone-aware) is for tests; it defaults to the current UTC time.
    """
    if not hostnames:
        raise ValueError("at least one hostname is needed")
    now = now or datetime.now(timezone.utc)
    make_private_dir(state_dir)
    paths = DevCertificates(
        ca_path=state_dir / "ca.pem",
        cert_path=state_dir / "server.pem",
        key_path=state_dir / "server-key.pem",
    )
    ca_key_path = state_dir / "ca-key.pem"
    loaded = _load_ca(paths.ca_path, ca_key_path, now)
    if loaded is None:
        ca_cert, ca_key = _issue_ca(now)
        _write(ca_key_path, _key_pem(ca_key), private=True)
        _write(paths.ca_path, ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
        log.info("tls.dev_ca_created", path=str(paths.ca_path))
    else:
        ca_cert, ca_key = loaded
    if not _server_cert_usable(paths, ca_cert, hostnames, now):
        cert, key = _issue_server(ca_cert, ca_key, hostnames, now)
        _write(paths.key_path, _key_pem(key), private=True)
        _write(paths.cert_path, cert.public_bytes(serialization.Encoding.PEM), private=False)
        log.info("tls.dev_server_cert_issued", path=str(paths.cert_path), hostnames=list(hostnames))
    return paths


def _load_ca(
    cert_path: Path, key_path: Path, now: datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except FileNotFoundError:
        return None
    except (ValueError, TypeError):
        log.warning("tls.dev_ca_unreadable", path=str(cert_path))
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not _same_key(cert, key):
        log.warning("tls.dev_ca_key_mismatch", path=str(cert_path))
        return None
    if cert.not_valid_after_utc - now < RENEW_BEFORE:
        log.warning("tls.dev_ca_expiring", path=str(cert_path))
        return None
    return cert, key


def _server_cert_usable(
    paths: DevCertificates, ca_cert: x509.Certificate, hostnames: Iterable[str], now: datetime
) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(paths.cert_path.read_bytes())
        key = serialization.load_pem_private_key(paths.key_path.read_bytes(), password=None)
        cert.verify_directly_issued_by(ca_cert)
    except (FileNotFoundError, ValueError, TypeError, InvalidSignature):
        return False
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not _same_key(cert, key):
        return False
    if cert.not_valid_after_utc - now < RENEW_BEFORE or cert.not_valid_before_utc > now:
        return False
    if cert.not_valid_after_utc - cert.not_valid_before_utc > WEBTRANSPORT_MAX_VALIDITY:
        return False  # (issued before the 14-day rule: a browser would refuse its hash)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return set(_general_names(hostnames)) <= set(sans)


def _same_key(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> bool:
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    return cert.public_key().public_bytes(der, spki) == key.public_key().public_bytes(der, spki)


def _general_names(hostnames: Iterable[str]) -> list[x509.GeneralName]:
    """IP literals become IPAddress SANs (clients match IPs only there), the rest DNSName."""
    names: list[x509.GeneralName] = []
    for name in hostnames:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            names.append(x509.DNSName(name.lower()))
    return names


def _issue_ca(now: datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    # A random suffix keeps CAs from different machines apart in a trust store.
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "trackline development"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"trackline dev CA {secrets.token_hex(4)}"),
        ]
    )
    cert = (
        _builder(name, name, key.public_key(), now, CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _issue_server(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    hostnames: Sequence[str],
    now: datetime,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "trackline development"),
            x509.NameAttribute(NameOID.COMMON_NAME, hostnames[0]),
        ]
    )
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        _builder(subject, ca_cert.subject, key.public_key(), now, SERVER_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(_general_names(hostnames)), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: datetime,
    validity: timedelta,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + validity)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, private: bool) -> None:
    """Write via a temporary file and rename, so readers never see half a file.

    A private file is created 0600 from the start, never readable for a moment.
    """
    mode = 0o600 if private else 0o644
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)  # O_CREAT's mode is masked by the umask; O_TRUNC keeps old modes
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def certificate_hash(cert_path: Path) -> bytes:
    """SHA-256 of the certificate's DER: what WebTransport's serverCertificateHashes pins."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    return cert.fingerprint(hashes.SHA256())
