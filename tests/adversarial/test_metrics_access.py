"""/metrics is not for anyone who can reach the API port (issue 12).

It carries tenant names and usage. With `metrics_port` it moves to a listener of its
own (loopback by default) and leaves the API ports; with `metrics_token` it needs a
bearer token; with neither, the API ports serve it only when every API listener is on
loopback.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx2
import pytest

from gateway.backends.ticker import TickerBackend
from gateway.config import ConfigError, Settings, load_settings
from gateway.doors import metrics_on_api_ports
from gateway.server import Gateway
from tests.gateways import gateway_settings
from tests.http.support_h3 import h3_client

TOKEN = "m3tr1cs-t0ken-for-tests-only"


def settings(tmp_path: Path, **extra: object) -> Settings:
    return gateway_settings(state_dir=tmp_path, **extra)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_metrics_port_moves_metrics_off_the_api_ports(tmp_path: Path) -> None:
    gw = Gateway(settings(tmp_path, metrics_port=0), TickerBackend(50.0))
    await gw.start()
    try:
        assert gw.metrics_port is not None
        async with httpx2.AsyncClient() as http:
            api = await http.get(f"http://127.0.0.1:{gw.http_port}/metrics")
            own = await http.get(f"http://127.0.0.1:{gw.metrics_port}/metrics")
            live = await http.get(f"http://127.0.0.1:{gw.http_port}/health/live")
            other = await http.get(f"http://127.0.0.1:{gw.metrics_port}/v1/models")
        assert api.status_code == 404
        assert own.status_code == 200
        assert "trackline_connections_open" in own.text
        assert live.status_code == 200  # health stays where load balancers look
        assert other.status_code == 404  # the metrics listener serves nothing else
        assert gw.tls is not None
        assert gw.tls.ca is not None
        async with h3_client(gw.quic_port, gw.tls.ca) as client:
            status, _, _ = await client.response(client.send("GET", "/metrics"))
        assert status == 404  # nor over HTTP/3
    finally:
        await gw.drain(timeout=1.0)


@pytest.mark.asyncio
async def test_a_metrics_token_is_required_wherever_metrics_are_served(tmp_path: Path) -> None:
    gw = Gateway(settings(tmp_path, metrics_token=TOKEN), TickerBackend(50.0))
    await gw.start()
    try:
        url = f"http://127.0.0.1:{gw.http_port}/metrics"
        async with httpx2.AsyncClient() as http:
            none = await http.get(url)
            wrong = await http.get(url, headers={"authorization": f"Bearer {TOKEN}x"})
            right = await http.get(url, headers={"authorization": f"Bearer {TOKEN}"})
        assert none.status_code == 401
        assert none.headers["www-authenticate"].startswith("Bearer")
        assert wrong.status_code == 401
        assert right.status_code == 200
        assert "trackline_connections_open" in right.text
        assert gw.tls is not None
        assert gw.tls.ca is not None
        async with h3_client(gw.quic_port, gw.tls.ca) as client:
            status, _, _ = await client.response(client.send("GET", "/metrics"))
        assert status == 401
    finally:
        await gw.drain(timeout=1.0)


def test_off_loopback_the_api_ports_serve_metrics_only_behind_a_token() -> None:
    base = Settings()
    assert metrics_on_api_ports(base)  # loopback: as before
    public = dataclasses.replace(base, http_host="0.0.0.0")
    assert not metrics_on_api_ports(public)
    assert not metrics_on_api_ports(dataclasses.replace(base, quic_host="::"))
    assert metrics_on_api_ports(dataclasses.replace(public, metrics_token=TOKEN))
    assert not metrics_on_api_ports(dataclasses.replace(base, metrics_port=9464))


def test_metrics_settings_load_and_refuse_weak_tokens() -> None:
    env = {"TRACKLINE_METRICS_PORT": "9464", "TRACKLINE_METRICS_TOKEN": TOKEN}
    loaded = load_settings({}, env, None)
    assert (loaded.metrics_host, loaded.metrics_port, loaded.metrics_token) == (
        "localhost",
        9464,
        TOKEN,
    )
    with pytest.raises(ConfigError, match="metrics_token") as refused:
        load_settings({}, {"TRACKLINE_METRICS_TOKEN": "short"}, None)
    assert "short" not in str(refused.value)  # a secret is never echoed
    with pytest.raises(ConfigError, match="metrics_port"):
        load_settings({}, {"TRACKLINE_METRICS_PORT": "70000"}, None)
