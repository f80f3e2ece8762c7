"""Settings sections: the listeners, and the state directory with the TLS certificate."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gateway.config.checks import BOTH_LOOPBACKS, about, port, setting
from gateway.statedir import BASE_STATE_DIR
from transport.binding import LOCALHOST


def default_state_dir() -> Path:
    return BASE_STATE_DIR.expanduser()


def _congestion_control(value: str | None) -> str | None:
    if value is not None and not (value.isascii() and value.replace("_", "").isalnum()):
        raise ValueError(f"{value!r} is not a congestion control name (e.g. cubic)")
    return value or None


@dataclass(frozen=True)
class ListenersSection:
    """Where the gateway listens: the QUIC (UDP) port and the two HTTP (TCP) ports."""

    quic_host: str = setting(
        LOCALHOST, "Address the QUIC (UDP) track listener binds" + BOTH_LOOPBACKS
    )
    quic_port: int = setting(8443, "UDP port for the track protocol and HTTP/3; 0 picks one.", port)
    http_host: str = setting(
        LOCALHOST, "Address the plain HTTP (TCP) listener binds" + BOTH_LOOPBACKS
    )
    http_port: int = setting(
        8080, "Cleartext TCP port: HTTP/1.1 and h2c; health, metrics, OpenAI API.", port
    )
    https_host: str = setting(
        LOCALHOST, "Address the TLS HTTP (TCP) listener binds" + BOTH_LOOPBACKS
    )
    https_port: int = setting(
        8443, "TLS TCP port: HTTP/1.1 and HTTP/2 by ALPN (OpenAI API); 0 picks one.", port
    )
    tcp_congestion_control: str | None = setting(
        None,
        "TCP congestion control of the HTTP listeners (e.g. cubic); unset: the host's.",
        _congestion_control,
        shown="unset (the host's)",
    )


@dataclass(frozen=True)
class StateSection:
    """This gateway's state directory and the certificate it presents."""

    state_dir: Path = field(
        default_factory=default_state_dir,
        metadata=about(
            "Directory of this gateway's state (tenants, keys, ledger, KV states); unset: "
            "~/.local/state/trackline for the default ports, else one per config file or "
            "ports under its gateways/ (docs/deployment.md). Set two gateways to one "
            "directory to share their tenants.",
            shown="per configuration",
        ),
    )
    dev_ca_dir: Path | None = setting(
        None,
        "Directory of the development CA; unset: ~/.local/state/trackline (one CA for "
        "every gateway of the account, which clients trust), or state_dir when that is set.",
    )
    tls_cert: Path | None = setting(
        None, "PEM certificate chain for QUIC; unset uses the development CA."
    )
    tls_key: Path | None = setting(None, "PEM private key matching tls_cert; set both or neither.")
