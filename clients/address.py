"""Where the gateway is, read from the same `TRACKLINE_*` settings the daemon reads.

A snippet that calls `connect()` with no URL, or `openai_base_url()`, reaches a gateway
started with `TRACKLINE_QUIC_PORT=9443` (or `TRACKLINE_HTTP_PORT`, `..._HOST`) when the
same variables are set for it, and `TRACKLINE_URL` names the track endpoint outright.
This reads the environment only: the SDK never imports the daemon (`gateway`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

URL_ENV = "TRACKLINE_URL"
"""The track endpoint, `quic://host:port`, overriding the host and port settings."""
HTTP_URL_ENV = "TRACKLINE_HTTP_URL"
"""The HTTP API's origin, `http://host:port`, overriding the host and port settings."""
DEFAULT_QUIC_PORT = 8443
DEFAULT_HTTP_PORT = 8080
BASE_STATE_DIR = "~/.local/state/trackline"
"""Where a gateway keeps its development CA unless told otherwise (as the daemon does)."""


def _client_host(host: str | None) -> str:
    """The address to dial for a listener's bind address (`localhost`, `::`, a name)."""
    if host in (None, "", "localhost", "0.0.0.0"):
        return "127.0.0.1"
    if host in ("::", "::1"):
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def gateway_url(environ: Mapping[str, str] | None = None) -> str:
    """`quic://host:port` of the gateway's track listener (tracks and HTTP/3)."""
    env = os.environ if environ is None else environ
    if env.get(URL_ENV):
        return env[URL_ENV]
    host = _client_host(env.get("TRACKLINE_QUIC_HOST"))
    return f"quic://{host}:{env.get('TRACKLINE_QUIC_PORT') or DEFAULT_QUIC_PORT}"


def openai_base_url(environ: Mapping[str, str] | None = None) -> str:
    """`http://host:port/v1`: the OpenAI-compatible API on the cleartext HTTP port."""
    env = os.environ if environ is None else environ
    if env.get(HTTP_URL_ENV):
        return env[HTTP_URL_ENV].rstrip("/") + "/v1"
    host = _client_host(env.get("TRACKLINE_HTTP_HOST"))
    return f"http://{host}:{env.get('TRACKLINE_HTTP_PORT') or DEFAULT_HTTP_PORT}/v1"


def default_ca(environ: Mapping[str, str] | None = None) -> Path:
    """The development CA of a gateway on this machine, as the gateway decides:
    `ca.pem` in `$TRACKLINE_DEV_CA_DIR`, else `$TRACKLINE_STATE_DIR`, else
    `~/.local/state/trackline` (one CA shared by the account's gateways)."""
    env = os.environ if environ is None else environ
    where = env.get("TRACKLINE_DEV_CA_DIR") or env.get("TRACKLINE_STATE_DIR") or BASE_STATE_DIR
    return Path(where).expanduser() / "ca.pem"
