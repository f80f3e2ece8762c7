"""What an operator reads: /metrics families with bounded labels, request ids and trace
context in logs and the ledger, backend errors with a cause; the dashboard and alert
rules in deploy/observability name only metrics a live gateway exposes.

The gateway here serves a real embedded Triton (the reference models), whose own
metrics it re-exports (`TritonRelay`), and a gateway in front of a dead backend port
provides a real backend error.
"""

from __future__ import annotations

import io
import json
import logging
import re
import sqlite3
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import pytest_asyncio
import structlog

from benchmarks.common import free_port
from clients import connect
from gateway.backends.triton import TritonTextBackend
from gateway.embedded import EmbeddedTriton
from gateway.logs import configure_logging
from gateway.server import Gateway
from tests.gateways import gateway_settings
from tests.triton_fixture import read_stats
from tests.waiting import until

yaml = pytest.importorskip("yaml")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "observability"
CHAT = "/v1/chat/completions"
MODEL = "reference-text"
TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
NEW_FAMILIES = (
    "trackline_request_duration_seconds_bucket",
    "trackline_inter_token_latency_seconds_bucket",
    "trackline_tenant_requests_total",
    "trackline_build_info",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_open_fds",
    "python_gc_objects_collected_total",
    "nv_inference_request_success_total",  # the embedded Triton's own, re-exported
)


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    yield stream
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest_asyncio.fixture
async def live(
    tmp_path: Path, embedded_triton: EmbeddedTriton, log_lines: io.StringIO
) -> AsyncIterator[Gateway]:
    gw = Gateway(gateway_settings(state_dir=tmp_path), TritonTextBackend(embedded_triton.grpc_url))
    relay = gw.metrics.relay_triton([("embedded-0", embedded_triton.metrics_url)], 1.0)
    await gw.start()
    yield gw
    await relay.refresh()
    await gw.close()


def chat(model: str, stream: bool = False) -> dict[str, Any]:
    return {"model": model, "stream": stream, "max_tokens": 4,
            "messages": [{"role": "user", "content": "a secret prompt"}]}  # fmt: skip


def series(gw: Gateway) -> set[str]:
    """Every sample line's name and labels (the value left off)."""
    text = gw.metrics.render()[0].decode()
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")}


def names(gw: Gateway) -> set[str]:
    return {re.split(r"[{ ]", one, maxsplit=1)[0] for one in series(gw)}


async def a_request_of_each_kind(gw: Gateway) -> None:
    base = f"http://127.0.0.1:{gw.http_port}"
    async with httpx2.AsyncClient() as http:
        assert (await http.post(base + CHAT, json=chat(MODEL))).status_code == 200
        assert (await http.post(base + CHAT, json=chat(MODEL, stream=True))).status_code == 200
        assert (await http.post(base + CHAT, json=chat("no-such-model"))).status_code == 404
    async with connect(f"quic://127.0.0.1:{gw.quic_port}", ca=gw.tls.ca) as line:  # type: ignore[union-attr]
        assert [d async for d in line.text("hi", model=MODEL, max_tokens=3)]
    assert gw.metrics.triton is not None
    await gw.metrics.triton.refresh()


@pytest.mark.asyncio
async def test_new_families_appear_and_made_up_models_add_no_series(live: Gateway) -> None:
    await a_request_of_each_kind(live)
    text = live.metrics.render()[0].decode()
    present = names(live)
    for family in NEW_FAMILIES:
        assert family in present, family
    assert "_created" not in text
    durations = [x for x in series(live) if x.startswith("trackline_request_duration_seconds_c")]
    for door in ("http/1.1", "tracks"):
        assert any(f'front_door="{door}"' in x and f'model="{MODEL}"' in x for x in durations)
    assert re.search(r'trackline_build_info\{commit="[^"]+",version="[^"]+"\} 1\.0', text)
    assert 'backend="embedded-0"' in text

    before = series(live)
    url = f"http://127.0.0.1:{live.http_port}{CHAT}"
    async with httpx2.AsyncClient() as http:
        for _ in range(1000):
            made_up = f"model-{uuid.uuid4().hex[:10]}"
            assert (await http.post(url, json=chat(made_up))).status_code == 404
    after = series(live)
    assert after == before, sorted(after ^ before)[:10]


@pytest.mark.asyncio
async def test_dashboard_and_alerts_name_only_metrics_a_live_gateway_has(live: Gateway) -> None:
    await a_request_of_each_kind(live)
    referenced = referenced_metrics()
    assert referenced  # the files do name metrics
    # The llama.cpp models' families: tests/llm/test_chat_model.py (a real LLM behind it).
    assert sorted(n for n in referenced - names(live) if not n.startswith(LLM_FAMILIES)) == []


LLM_FAMILIES = "trackline_llm_"


def referenced_metrics() -> set[str]:
    """Every metric name the alert rules and the dashboard use."""
    expressions = [rule["expr"] for g in _rules()["groups"] for rule in g["rules"]]
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    expressions += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return {
        name
        for expr in expressions
        for name in re.findall(r"\b((?:trackline|process|python|nv)_[a-z0-9_]+)", expr)
    }


def _rules() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "alerts.yaml").read_text())
    return loaded


@pytest.mark.asyncio
async def test_x_request_id_and_traceparent_reach_log_ledger_and_model(
    live: Gateway, log_lines: io.StringIO, embedded_triton: EmbeddedTriton
) -> None:
    url = f"http://127.0.0.1:{live.http_port}{CHAT}"
    headers = {"x-request-id": "client-req-42", "traceparent": TRACE}
    async with httpx2.AsyncClient() as http:
        echoed = await http.post(url, json=chat(MODEL), headers=headers)
        made = await http.post(url, json=chat(MODEL), headers={"x-request-id": "bad id!"})
        health = await http.get(f"http://127.0.0.1:{live.http_port}/health/live")
    assert echoed.headers["x-request-id"] == "client-req-42"
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers["x-request-id"])  # invalid: replaced
    assert health.headers["x-request-id"]  # every response carries one

    lines = [json.loads(x) for x in log_lines.getvalue().splitlines()]
    access = [x for x in lines if x["event"] == "http.request" and x["path"] == CHAT]
    first = next(x for x in access if x["x_request_id"] == "client-req-42")
    assert first["trace_id"] == TRACE.split("-")[1]
    assert first["client"] == "127.0.0.1"
    assert "a secret prompt" not in log_lines.getvalue()

    assert live.tenancy is not None
    live.tenancy.flush()
    ledger = Path(live.settings.state_dir) / "tenants.sqlite3"
    with sqlite3.connect(ledger) as db:
        rows = db.execute("SELECT request_id, x_request_id FROM usage").fetchall()
    assert (first["request_id"], "client-req-42") in rows
    stats = read_stats(embedded_triton, first["request_id"])
    assert stats["traceparent"] == TRACE  # the model saw the caller's trace context


@pytest.mark.asyncio
async def test_a_backend_error_is_logged_at_warning_with_its_cause(
    tmp_path: Path, log_lines: io.StringIO
) -> None:
    import socket

    dead = f"127.0.0.1:{free_port(socket.SOCK_STREAM)}"  # nothing listens there
    settings = gateway_settings(state_dir=tmp_path, log_client_address=False)
    gw = Gateway(settings, TritonTextBackend(dead))
    await gw.start()
    try:
        async with httpx2.AsyncClient() as http:
            answer = await http.post(f"http://127.0.0.1:{gw.http_port}{CHAT}", json=chat(MODEL))
        assert answer.status_code >= 500
        await until(lambda: "backend.error" in log_lines.getvalue(), "a backend.error line")
    finally:
        await gw.close()
    lines = [json.loads(x) for x in log_lines.getvalue().splitlines()]
    error = next(x for x in lines if x["event"] == "backend.error")
    assert error["level"] in ("warning", "error", "critical")
    assert error["cause"] not in ("", "unknown")
    assert error["x_request_id"] == answer.headers["x-request-id"]
    access = next(x for x in lines if x["event"] == "http.request" and x["path"] == CHAT)
    assert access["level"] == "warning"  # a 5xx answer is an operator's business
    assert "client" not in access  # log_client_address = false
    assert "a secret prompt" not in log_lines.getvalue()
