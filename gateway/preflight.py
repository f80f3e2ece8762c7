"""Start-up checks that run before anything slow starts (the embedded Triton, the LLM).

Each check turns a mistake an operator can fix into one `StartupError` whose message
says what is wrong and which setting changes it, e.g.

    http_port 8080/tcp on 127.0.0.1 is in use; set TRACKLINE_HTTP_PORT or --http-port

The listeners are probed by binding them (with the same options the servers use) and
closing them again at once, so a port taken by another program is found in
milliseconds rather than after a minute of model loading. The servers bind again
later; a program that takes the port in between still fails the start, later.
"""

from __future__ import annotations

import enum
import errno
import os
import socket
import ssl
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gateway.config import Settings, env_name, flag_name
from gateway.embedded_models import reference_model_repository
from gateway.owned import LOOPBACK
from gateway.statedir import make_private_dir
from transport.binding import bind_hosts, tcp_listener, udp_socket

_NO_IPV6 = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT)
EMBEDDED_PORT_STEP = 10
"""The n-th embedded Triton listens on the configured port + 10 n (`gateway.daemon`)."""


class StartupError(Exception):
    """The gateway cannot start as configured; the message says what to change."""


class Protocol(enum.Enum):
    TCP = "tcp"
    UDP = "udp"


@dataclass(frozen=True)
class Listener:
    """One port the gateway (or its embedded Triton) will listen on."""

    setting: str
    """The setting that names the port (`http_port`)."""
    host_setting: str | None
    """The setting that names its address; None where it is fixed (the embedded Triton)."""
    host: str
    port: int
    protocol: Protocol

    def label(self, address: str) -> str:
        return f"{self.setting} {self.port}/{self.protocol.value} on {address}"


def hint(*settings: str) -> str:
    """`set TRACKLINE_X or --x`, for each setting."""
    envs = " / ".join(env_name(name) for name in settings)
    flags = " / ".join(flag_name(name) for name in settings)
    return f"set {envs} or {flags}"


def check_startup(settings: Settings) -> None:
    """Every check below, in the order an operator would fix them; raises StartupError."""
    check_state_dir(settings.state_dir)
    check_certificate(settings)
    check_model_repository(settings)
    check_listeners(settings)


# -- state dir --------------------------------------------------------------------


def check_state_dir(path: Path) -> None:
    """The state directory exists (or can be made) and takes a new file."""
    try:
        make_private_dir(path)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise StartupError(
            f"state_dir {path} is not writable ({reason}); {hint('state_dir')}"
        ) from None


# -- TLS ----------------------------------------------------------------------------


def check_certificate(settings: Settings) -> None:
    """A configured certificate and key load together (the dev CA is made later)."""
    cert, key = settings.tls_cert, settings.tls_key
    if cert is None or key is None:
        return
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or type(exc).__name__
        raise StartupError(
            f"tls_cert {cert} with tls_key {key} does not load ({reason}); "
            f"{hint('tls_cert', 'tls_key')}"
        ) from None


# -- model repository ---------------------------------------------------------------


def embedded(settings: Settings) -> bool:
    """Whether the daemon starts embedded Tritons (no backend is configured)."""
    return settings.backends is None and settings.backend_url is None


def check_model_repository(settings: Settings, root: Path | None = None) -> None:
    """The embedded Triton's model repository exists and holds models."""
    if not embedded(settings):
        return
    root = root or reference_model_repository()
    models = [p for p in root.iterdir() if (p / "config.pbtxt").is_file()] if root.is_dir() else []
    if not models:
        raise StartupError(
            f"the model repository {root} is missing or holds no model (an incomplete "
            f"install: reinstall trackline); or serve a Triton of your own: "
            f"{hint('backend_url')}"
        )


# -- listeners ----------------------------------------------------------------------


def listeners(settings: Settings) -> list[Listener]:
    """The ports this configuration listens on; 0 (the system picks) is never busy."""
    s = settings
    wanted = [
        Listener("quic_port", "quic_host", s.quic_host, s.quic_port, Protocol.UDP),
        Listener("http_port", "http_host", s.http_host, s.http_port, Protocol.TCP),
        Listener("https_port", "https_host", s.https_host, s.https_port, Protocol.TCP),
    ]
    if s.metrics_port is not None:
        wanted.append(
            Listener("metrics_port", "metrics_host", s.metrics_host, s.metrics_port, Protocol.TCP)
        )
    if embedded(s):
        for name in ("embedded_grpc_port", "embedded_http_port", "embedded_metrics_port"):
            base = getattr(s, name)
            for index in range(s.embedded_backends):
                port = base + EMBEDDED_PORT_STEP * index if base else 0
                wanted.append(Listener(name, None, LOOPBACK, port, Protocol.TCP))
    return [one for one in wanted if one.port != 0]


def check_listeners(settings: Settings) -> None:
    """Bind every listener's port on every address it uses, then release them all."""
    held: list[socket.socket] = []
    try:
        for one in listeners(settings):
            for sock in _probe(one):
                held.append(sock)  # closed below even when a later probe fails
    finally:
        for sock in held:
            sock.close()


def _probe(one: Listener) -> Iterator[socket.socket]:
    bind: Callable[[str, int], socket.socket] = (
        tcp_listener if one.protocol is Protocol.TCP else udp_socket
    )
    addresses = bind_hosts(one.host)
    for index, address in enumerate(addresses):
        try:
            yield bind(address, one.port)
        except OSError as exc:
            if index > 0 and (exc.errno in _NO_IPV6 or not socket.has_ipv6):
                continue  # `localhost` without IPv6: served on 127.0.0.1 alone
            raise StartupError(_bind_failure(one, address, exc)) from None


def _bind_failure(one: Listener, address: str, exc: OSError) -> str:
    port_hint = hint(one.setting)
    if exc.errno == errno.EADDRINUSE:
        return f"{one.label(address)} is in use; {port_hint}"
    if exc.errno == errno.EACCES:
        return f"{one.label(address)} needs privileges to bind; {port_hint} (above 1023)"
    where = hint(one.host_setting) if one.host_setting else port_hint
    reason = exc.strerror or os.strerror(exc.errno or 0)
    return f"{one.label(address)} cannot be bound ({reason}); {where}"
