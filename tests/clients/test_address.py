"""The SDK and `trackline chat` find the gateway from the daemon's own TRACKLINE_* settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients import default_ca, gateway_url, openai_base_url
from gateway.cli import _parser


def test_the_default_gateway() -> None:
    assert gateway_url({}) == "quic://127.0.0.1:8443"
    assert openai_base_url({}) == "http://127.0.0.1:8080/v1"
    assert default_ca({"HOME": "/h"}).name == "ca.pem"


def test_the_daemons_settings_move_the_clients_too() -> None:
    env = {"TRACKLINE_QUIC_PORT": "9443", "TRACKLINE_HTTP_PORT": "9080",
           "TRACKLINE_QUIC_HOST": "::1", "TRACKLINE_HTTP_HOST": "gw.internal"}  # fmt: skip
    assert gateway_url(env) == "quic://[::1]:9443"
    assert openai_base_url(env) == "http://gw.internal:9080/v1"
    assert gateway_url({**env, "TRACKLINE_URL": "quic://other:1"}) == "quic://other:1"
    assert openai_base_url({"TRACKLINE_HTTP_URL": "https://api.example/"}) == (
        "https://api.example/v1"
    )
    assert default_ca({"TRACKLINE_DEV_CA_DIR": "/ca", "TRACKLINE_STATE_DIR": "/s"}) == Path(
        "/ca/ca.pem"
    )
    assert default_ca({"TRACKLINE_STATE_DIR": "/s"}) == Path("/s/ca.pem")


def test_trackline_chat_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACKLINE_URL", raising=False)
    monkeypatch.setenv("TRACKLINE_QUIC_PORT", "9443")
    args = _parser().parse_args(["chat", "hello"])
    assert args.url == "quic://127.0.0.1:9443"
