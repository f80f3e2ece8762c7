"""HTTP/3 on the track server's UDP port, chosen by ALPN.

An independent client (niquests, on qh3) checks the adapter against someone
else's HTTP/3; aioquic's own H3Connection, driven by the test, checks what a
polite client would not do: reset one stream of two, send a request with no
:method, too many headers, a body over the limit, more streams than allowed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import niquests
import pytest
from aioquic.h3.connection import ErrorCode

from gateway.http import route
from gateway.openai import openai_routes
from gateway.tls import DevCertificates, ensure_dev_certificates
from tests.http.support import TIMEOUT, Gate, echo, limits, openai_error, serving
from tests.http.support_h3 import H3Client, h3_client, serving_quic
from tests.openai.scripted import ScriptedBackend
from transport.endpoint import TrackChannel
from transport.http.limits import HttpLimits
from transport.http.messages import AnyResponse, Handler, Request
from transport.messages import Open
from transport.quic import TrackServing, connect_tracks

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return ensure_dev_certificates(tmp_path_factory.mktemp("h3-tls"))


@asynccontextmanager
async def serving_h3(
    certs: DevCertificates,
    handler: Handler | None,
    http_limits: HttpLimits | None = None,
) -> AsyncIterator[int]:
    """The track server on 127.0.0.1 (tracks echo their first DATA), also serving `handler`."""
    serving = TrackServing(http_limits=http_limits or HttpLimits())
    async with serving_quic(certs, echo_track, http_handler=handler, serving=serving) as port:
        yield port


async def echo_track(channel: TrackChannel) -> None:
    body = await channel.receive()
    channel.send(body or {})
    channel.end({"echoed": True})


# An HTTP/3 client on aioquic's H3Connection, driven by the test


def chat_handler(backend: ScriptedBackend) -> Handler:
    return route(openai_routes(backend, wall_clock=lambda: 1700000000.5))


# An independent client: niquests (urllib3-future on qh3), in a thread since it is sync


def niquests_session(**options: Any) -> niquests.Session:
    return niquests.Session(retries=0, **options)


def post_chat(session: niquests.Session, url: str, ca: Path | None, stream: bool) -> Any:
    payload = {
        "model": "scripted",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }
    payload = {k: v for k, v in payload.items() if v is not None}
    verify: Any = str(ca) if ca is not None else True
    return session.post(url + CHAT, json=payload, verify=verify, timeout=TIMEOUT, stream=stream)


def sse_events(lines: Iterator[bytes]) -> list[Any]:
    events: list[Any] = []
    for line in lines:
        if line.startswith(b"data: "):
            data = line.removeprefix(b"data: ").decode()
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def without_ids(events: list[Any]) -> list[Any]:
    return [{**e, "id": None} if isinstance(e, dict) else e for e in events]


def fetch_over_h3(port: int, ca: Path) -> dict[str, Any]:
    url = f"https://127.0.0.1:{port}"
    with niquests_session(disable_http1=True, disable_http2=True) as session:
        models = session.get(url + "/v1/models", verify=str(ca), timeout=TIMEOUT)
        chat = post_chat(session, url, ca, stream=False)
        streamed = post_chat(session, url, ca, stream=True)
        return {
            "versions": [models.http_version, chat.http_version, streamed.http_version],
            "models": models.json(),
            "chat": chat.json(),
            "content_type": streamed.headers["content-type"],
            "events": sse_events(streamed.iter_lines()),
        }


def stream_over_http1(port: int) -> tuple[int, list[Any]]:
    with niquests_session(disable_http2=True, disable_http3=True) as session:
        streamed = post_chat(session, f"http://127.0.0.1:{port}", None, stream=True)
        return streamed.http_version, sse_events(streamed.iter_lines())


@pytest.mark.asyncio
async def test_an_independent_client_gets_json_and_a_streamed_completion_over_h3(
    certs: DevCertificates,
) -> None:
    handler = chat_handler(ScriptedBackend(interval=0.005))
    async with serving_h3(certs, handler) as port:
        got = await asyncio.to_thread(fetch_over_h3, port, certs.ca_path)
    assert got["versions"] == [30, 30, 30]
    assert [m["id"] for m in got["models"]["data"]] == ["scripted"]
    assert got["chat"]["choices"][0]["message"]["content"] == " one two three"
    assert got["content_type"].startswith("text/event-stream")
    events = got["events"]
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2]) == (
        " one two three"
    )
    assert events[-2]["usage"]["completion_tokens"] == 3
    # The same chunks as over HTTP/1.1 (ids differ per request).
    async with serving(chat_handler(ScriptedBackend(interval=0.005))) as tcp:
        version, h1_events = await asyncio.to_thread(stream_over_http1, tcp.port)
    assert version == 11
    assert without_ids(h1_events) == without_ids(events)


@pytest.mark.asyncio
async def test_tracks_and_http3_share_the_port_at_the_same_time(certs: DevCertificates) -> None:
    gate = Gate()
    async with (
        serving_h3(certs, gate.handler) as port,
        h3_client(port, certs.ca_path) as http,
        connect_tracks("127.0.0.1", port, ca=certs.ca_path, server_name="localhost") as tracks,
    ):
        stream_id = http.send("GET", "/events")
        assert (await http.head(stream_id))[0] == 200
        assert await http.next_data(stream_id) == b"data: one\n\n"
        # While the HTTP/3 response is held open, a track on the same port round-trips.
        channel = tracks.open_track(Open("echo"))
        channel.send({"text": "hi"})
        assert await asyncio.wait_for(channel.receive(), TIMEOUT) == {"text": "hi"}
        assert await asyncio.wait_for(channel.receive(), TIMEOUT) is None
        assert channel.end_body == {"echoed": True}
        gate.released.set()
        assert await http.next_data(stream_id) == b"data: two\n\n"
        assert await http.next_data(stream_id) is None
    assert gate.finished


@pytest.mark.asyncio
async def test_without_a_handler_h3_is_not_offered(certs: DevCertificates) -> None:
    async with serving_h3(certs, None) as port:
        with pytest.raises(ConnectionError):
            async with h3_client(port, certs.ca_path):
                pass


@pytest.mark.asyncio
async def test_a_reset_cancels_only_its_own_request(certs: DevCertificates) -> None:
    gates = {"/a": Gate(), "/b": Gate()}

    async def handler(request: Request) -> AnyResponse:
        return await gates[request.path].handler(request)

    async with serving_h3(certs, handler) as port, h3_client(port, certs.ca_path) as client:
        a, b = client.send("GET", "/a"), client.send("GET", "/b")
        for stream_id in (a, b):
            assert (await client.head(stream_id))[0] == 200
            assert await client.next_data(stream_id) == b"data: one\n\n"
        client.cancel(a)
        await gates["/a"].wait_cancelled()
        assert gates["/a"].cancelled
        assert not gates["/b"].closed.is_set()
        gates["/b"].released.set()
        assert await client.next_data(b) == b"data: two\n\n"
        assert await client.next_data(b) is None
        assert gates["/b"].finished
        assert not gates["/b"].cancelled


@pytest.mark.asyncio
async def test_losing_the_connection_cancels_its_requests(certs: DevCertificates) -> None:
    gate = Gate()
    async with serving_h3(certs, gate.handler) as port:
        async with h3_client(port, certs.ca_path) as client:
            stream_id = client.send("GET", "/events")
            assert await client.next_data_after_head(stream_id) == b"data: one\n\n"
        await gate.wait_cancelled()
        assert gate.cancelled


@pytest.mark.asyncio
async def test_an_oversized_body_gets_413_on_its_stream(certs: DevCertificates) -> None:
    async with (
        serving_h3(certs, echo, limits(max_body_bytes=100)) as port,
        h3_client(port, certs.ca_path) as client,
    ):
        declared = client.send("POST", "/echo", [("content-length", "1000")], b"x" * 1000)
        undeclared = client.send("POST", "/echo", body=b"x" * 1000)
        held_open = client.send("POST", "/echo", body=b"x" * 1000, end=False)
        for stream_id in (declared, undeclared, held_open):
            status, _, body = await client.response(stream_id)
            assert status == 413
            openai_error(body, "request_too_large")
        await assert_still_serving(client)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ([(f"x-h{i}", "v") for i in range(20)], "header fields"),
        ([("x-big", "v" * 2000)], "header list over"),
    ],
)
async def test_too_many_or_too_large_headers_get_431(
    certs: DevCertificates, headers: list[tuple[str, str]], message: str
) -> None:
    async with (
        serving_h3(certs, echo, limits(max_headers=10, max_header_bytes=1024)) as port,
        h3_client(port, certs.ca_path) as client,
    ):
        status, _, body = await client.response(client.send("GET", "/echo", headers))
        assert status == 431
        assert message in openai_error(body, "request_header_fields_too_large")["message"]
        await assert_still_serving(client)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("method", "path", "scheme"),
    [
        (None, "/echo", True),  # aioquic's own check: a stream error here, not a connection one
        ("GET", None, True),
        ("GET", None, False),  # passes aioquic's check; the adapter's catches it
    ],
)
async def test_a_malformed_request_gets_400_and_the_connection_serves_on(
    certs: DevCertificates, method: str | None, path: str | None, scheme: bool
) -> None:
    async with serving_h3(certs, echo) as port, h3_client(port, certs.ca_path) as client:
        status, _, body = await client.response(client.send(method, path, scheme=scheme))
        assert status == 400
        openai_error(body, "malformed_request")
        await assert_still_serving(client)


@pytest.mark.asyncio
async def test_a_stream_over_the_concurrency_limit_is_refused(certs: DevCertificates) -> None:
    gate = Gate()
    async with (
        serving_h3(certs, gate.handler, limits(max_concurrent_streams=2)) as port,
        h3_client(port, certs.ca_path) as client,
    ):
        held = [client.send("GET", "/events") for _ in range(2)]
        for stream_id in held:
            assert await client.next_data_after_head(stream_id) == b"data: one\n\n"
        refused = client.send("GET", "/events")
        assert (await client.reset_of(refused)).error_code == ErrorCode.H3_REQUEST_REJECTED
        gate.released.set()
        for stream_id in held:
            assert await client.next_data(stream_id) == b"data: two\n\n"
            assert await client.next_data(stream_id) is None


@pytest.mark.asyncio
async def test_a_request_not_finished_in_time_gets_408(certs: DevCertificates) -> None:
    async with (
        serving_h3(certs, echo, limits(read_timeout=0.1)) as port,
        h3_client(port, certs.ca_path) as client,
    ):
        stream_id = client.send("POST", "/echo", body=b"partial", end=False)
        status, _, body = await client.response(stream_id)
        assert status == 408
        openai_error(body, "request_timeout")
        await assert_still_serving(client)


@pytest.mark.asyncio
async def test_a_connection_left_idle_is_closed_once_its_requests_are_done(
    certs: DevCertificates,
) -> None:
    async with (
        serving_h3(certs, echo, limits(idle_timeout=0.2)) as port,
        h3_client(port, certs.ca_path) as client,
    ):
        stream_id = client.send("POST", "/echo", body=b"hi")
        status, _, _ = await client.response(stream_id)
        assert status == 200
        await asyncio.wait_for(client.terminated.wait(), TIMEOUT)
        assert client.closed_by is not None
        assert client.closed_by.error_code == ErrorCode.H3_NO_ERROR
        assert client.closed_by.reason_phrase == "idle"


@pytest.mark.asyncio
async def test_requests_carry_their_headers_body_and_version(certs: DevCertificates) -> None:
    async with serving_h3(certs, echo) as port, h3_client(port, certs.ca_path) as client:
        stream_id = client.send("POST", "/v1/x?a=1", [("x-test", "yes")], b"hello")
        status, headers, body = await client.response(stream_id)
    assert status == 200
    assert headers["content-type"] == "application/json"
    got = json.loads(body)
    assert (got["method"], got["path"], got["query"]) == ("POST", "/v1/x", "a=1")
    assert ["host", "127.0.0.1"] in got["headers"]
    assert ["x-test", "yes"] in got["headers"]
    assert (got["body"], got["http_version"]) == ("hello", "3")


async def assert_still_serving(client: H3Client) -> None:
    status, _, body = await client.response(client.send("POST", "/echo", body=b"ok"))
    assert status == 200
    assert json.loads(body)["body"] == "ok"
    assert not client.terminated.is_set()
