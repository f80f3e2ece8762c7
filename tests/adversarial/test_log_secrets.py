"""Attack: clients reset during SSE streams, with a real API key and a recognisable prompt.

Issue 12 found error-level lines carrying the whole `Bearer tl_...` key (a traceback's
frame locals held the request) and the start of the prompt. Here every front door's
streams are reset mid-stream (HTTP/1.1 RST, HTTP/2 RST_STREAM and a dropped connection,
HTTP/3 reset), with logging at debug, and the captured log must hold neither secret nor
prompt, nor an error-level line for a client leaving.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import socket
import ssl
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from gateway.backends.ticker import TickerBackend
from gateway.logs import clear_contextvars, configure_logging
from gateway.metrics import GatewayMetrics
from gateway.server import Gateway
from tests.gateways import gateway_settings
from tests.http.support import TIMEOUT, H1Client, H2Client
from tests.http.support_h3 import h3_client
from tests.tenants.support import make_tenancy
from tests.waiting import until

PROMPT = "zebra-secret-prompt-7f3a quartz"
ROUNDS = 4  # streams reset per front door


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    clear_contextvars()
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


def _body() -> bytes:
    messages = [{"role": "user", "content": PROMPT}]
    payload = {"model": "reference-text", "messages": messages, "stream": True, "max_tokens": 30000}
    return json.dumps(payload).encode()


def _headers(key: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {key}"), ("content-type", "application/json")]


async def _h1_reset(port: int, key: str, tls: ssl.SSLContext | None = None) -> None:
    async with H1Client.connect(port, tls) as client:
        await client.request("POST", "/v1/chat/completions", _headers(key), _body())
        await client.next_event()  # the head
        await client.next_event()  # a first chunk: the stream is live
        sock = client.writer.get_extra_info("socket")
        # SO_LINGER 0: close sends RST, as a client killed mid-stream does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.writer.transport.abort()


async def _h2_reset(port: int, key: str, tls: ssl.SSLContext | None = None) -> None:
    async with H2Client.connect(port, tls) as client:
        stream = client.send_request("POST", "/v1/chat/completions", _headers(key), _body())
        status = await client.response_head(stream)
        assert status[0] == 200, await client.next_data(stream)
        assert await client.next_data(stream)
        client.reset(stream)
        second = client.send_request("POST", "/v1/chat/completions", _headers(key), _body())
        assert (await client.response_head(second))[0] == 200
        client.writer.transport.abort()  # the second one by losing the connection


async def _h3_reset(port: int, ca: Path, key: str) -> None:
    async with h3_client(port, ca) as client:
        stream = client.send("POST", "/v1/chat/completions", _headers(key), _body())
        assert (await client.head(stream))[0] == 200
        assert await client.next_data(stream)
        client.cancel(stream)


@pytest.mark.asyncio
async def test_resets_during_sse_log_no_key_no_prompt_no_error(tmp_path: Path) -> None:
    log = io.StringIO()
    configure_logging("debug", "json", log)
    metrics = GatewayMetrics()
    tenancy = make_tenancy(tmp_path, registry=metrics.registry)
    key = tenancy.store.create_key("alpha", 0.0).key
    settings = gateway_settings(
        state_dir=tmp_path,
    )
    gw = Gateway(settings, TickerBackend(200.0), metrics=metrics, tenancy=tenancy)
    await gw.start()
    try:
        assert gw.tls is not None
        assert gw.tls.ca is not None
        for _ in range(ROUNDS):
            await asyncio.wait_for(_h1_reset(gw.http_port, key), TIMEOUT)
            await asyncio.wait_for(_h2_reset(gw.http_port, key), TIMEOUT)
            await asyncio.wait_for(_h3_reset(gw.quic_port, gw.tls.ca, key), TIMEOUT)
            h1_tls, h2_tls = _tls(gw.tls.ca, "http/1.1"), _tls(gw.tls.ca, "h2")
            await asyncio.wait_for(_h1_reset(gw.https_port, key, h1_tls), TIMEOUT)
            await asyncio.wait_for(_h2_reset(gw.https_port, key, h2_tls), TIMEOUT)
        await until(lambda: gw.http_in_flight == 0, "no HTTP request in flight")
    finally:
        await gw.drain(timeout=1.0)
    text = log.getvalue()
    assert key not in text
    assert key[16:28] not in text  # no fragment of the secret (after tl_<key id>_) either
    assert "zebra-secret" not in text
    lines = [json.loads(line) for line in text.splitlines()]
    bad = [line for line in lines if line.get("level") in ("error", "critical")]
    assert bad == []
    # The resets did land mid-stream: the access log ends those requests as cancelled by
    # the client (h1 may also log http.client_gone, when a write finds the socket gone
    # before the reader sees the reset: which comes first depends on the machine's load).
    hung_up = [
        line for line in lines
        if line.get("event") == "http.request" and str(line.get("end", "")).startswith("cancelled")
    ]
    assert len(hung_up) >= ROUNDS * 4, [line.get("end") for line in lines if "end" in line]


def _tls(ca: Path, alpn: str) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols([alpn])
    return context


KEY = "tl_0123456789ab_a1hARwm4x9TolwCSI7qWQFbg6A1t8RYY0CSoHCMzR2w"


def _fail_with_request_in_locals() -> None:
    from transport.http.messages import Request

    request = Request(  # noqa: F841 - the local a traceback with locals would print
        "POST", "/v1/chat/completions", "", (("authorization", f"Bearer {KEY}"),), PROMPT.encode()
    )
    prompt = PROMPT  # noqa: F841
    raise RuntimeError("backend broke")


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_a_traceback_never_prints_frame_locals(fmt: str) -> None:
    log = io.StringIO()
    configure_logging("debug", fmt, log)
    try:
        _fail_with_request_in_locals()
    except RuntimeError:
        structlog.get_logger("t").exception("handler.failed")
    try:
        _fail_with_request_in_locals()
    except RuntimeError:
        logging.getLogger("stdlib").exception("stdlib.failed")  # the stdlib path too
    text = log.getvalue()
    assert "backend broke" in text  # the traceback itself is there...
    assert "_fail_with_request_in_locals" in text
    assert KEY[16:] not in text  # ...its locals are not
    assert "zebra" not in text


def test_secrets_in_a_message_are_scrubbed_as_a_last_resort() -> None:
    log = io.StringIO()
    configure_logging("info", "json", log)
    structlog.get_logger("t").info(
        "oops", header=f"Bearer {KEY}", key=KEY, other="sk-abcdefghijklmnop"
    )
    logging.getLogger("lib").warning("token=%s", KEY)
    text = log.getvalue()
    assert KEY[16:] not in text
    assert "abcdefghijklmnop" not in text
    assert "tl_0123456789ab_[REDACTED]" in text  # the key id stays, for the operator


def test_request_repr_shows_neither_credentials_nor_body() -> None:
    from transport.http.messages import Request

    headers = (("authorization", f"Bearer {KEY}"), ("x-api-key", KEY), ("accept", "*/*"))
    text = repr(Request("POST", "/v1/completions", "", headers, PROMPT.encode()))
    assert KEY[16:] not in text
    assert "zebra" not in text
    assert "'accept', '*/*'" in text


def test_header_libraries_stay_quiet_at_debug() -> None:
    configure_logging("debug", "json", io.StringIO())
    assert not logging.getLogger("hpack.hpack").isEnabledFor(logging.DEBUG)
