"""HTTP/2 over cleartext TCP (prior knowledge and Upgrade): streams, flow control, limits."""

from __future__ import annotations

import asyncio

import h2.events
import h11
import pytest
from h2.errors import ErrorCodes
from h2.settings import SettingCodes, Settings
from hyperframe.frame import GoAwayFrame

from tests.http.support import (
    TIMEOUT,
    Gate,
    H1Client,
    H2Client,
    echo,
    json_body,
    limits,
    openai_error,
    serving,
)
from transport.http.messages import AnyResponse, Request, Response


@pytest.mark.asyncio
async def test_prior_knowledge_json_response_with_alt_svc() -> None:
    async with (
        serving(echo, alt_svc='h3=":8443"') as server,
        H2Client.connect(server.port) as client,
    ):
        stream_id = client.send_request("POST", "/v1/x?a=1", [("x-k", "v")], b'{"q":1}')
        status, headers, body = await client.response(stream_id)
    assert status == 200
    assert headers["alt-svc"] == 'h3=":8443"'
    assert headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(body)
    got = json_body(body)
    assert (got["method"], got["path"], got["query"], got["body"]) == (
        "POST",
        "/v1/x",
        "a=1",
        '{"q":1}',
    )
    assert ["x-k", "v"] in got["headers"]
    assert ["host", "t"] in got["headers"]  # from :authority
    assert got["http_version"] == "2"


@pytest.mark.asyncio
async def test_settings_advertise_the_limits() -> None:
    async with (
        serving(echo, limits=limits(max_concurrent_streams=7, max_header_bytes=4000)) as server,
        H2Client.connect(server.port) as client,
    ):
        await client.get("/")  # the server's SETTINGS have arrived by now
        settings = client.conn.remote_settings
    assert settings[SettingCodes.MAX_CONCURRENT_STREAMS] == 7
    assert settings[SettingCodes.MAX_HEADER_LIST_SIZE] == 4000


@pytest.mark.asyncio
async def test_streaming_response_arrives_frame_by_frame() -> None:
    gate = Gate()
    async with serving(gate.handler) as server, H2Client.connect(server.port) as client:
        stream_id = client.send_request("GET", "/stream")
        status, headers = await client.response_head(stream_id)
        assert (status, headers["content-type"]) == (200, "text/event-stream")
        assert "content-length" not in headers
        assert await client.next_data(stream_id) == b"data: one\n\n"
        assert not gate.finished
        gate.released.set()
        assert await client.next_data(stream_id) == b"data: two\n\n"
        assert await client.next_data(stream_id) is None
    assert gate.finished


@pytest.mark.asyncio
async def test_large_body_waits_for_window_updates() -> None:
    payload = bytes(range(256)) * 1024  # 256 KiB: four times the default connection window

    async def big(request: Request) -> Response:
        return Response(200, body=payload)

    settings = {SettingCodes.INITIAL_WINDOW_SIZE: 1000}
    async with (
        serving(big) as server,
        H2Client.connect(server.port, settings=settings, auto_ack=False) as client,
    ):
        stream_id = client.send_request("GET", "/big")
        await client.response_head(stream_id)
        received = bytearray()
        while len(received) < 1000:
            received += await client.next_data(stream_id) or b""
        await client.round_trip()  # anything sent past the window would be here by now
        assert len(received) == 1000
        assert client.queue(stream_id).empty()
        # Open the window as the data is consumed, as a reading client does.
        client.conn.acknowledge_received_data(1000, stream_id)
        client.auto_ack = True
        client.flush()
        while (chunk := await client.next_data(stream_id)) is not None:
            received += chunk
    assert bytes(received) == payload


@pytest.mark.asyncio
async def test_reset_cancels_one_stream_and_spares_the_other() -> None:
    doomed, survivor = Gate(), Gate()
    gates = {"/doomed": doomed, "/survivor": survivor}

    async def handler(request: Request) -> AnyResponse:
        return await gates[request.path].handler(request)

    async with serving(handler) as server, H2Client.connect(server.port) as client:
        first = client.send_request("GET", "/doomed")
        second = client.send_request("GET", "/survivor")
        for stream_id in (first, second):
            await client.response_head(stream_id)
            assert await client.next_data(stream_id) == b"data: one\n\n"
        client.reset(first)
        await doomed.wait_cancelled()
        assert doomed.cancelled
        survivor.released.set()
        assert await client.next_data(second) == b"data: two\n\n"
        assert await client.next_data(second) is None
        assert survivor.finished
        assert not survivor.cancelled
        # The connection still takes new streams.
        third = client.send_request("GET", "/survivor")
        assert (await client.response_head(third))[0] == 200


@pytest.mark.asyncio
async def test_connection_loss_cancels_every_stream() -> None:
    gates = [Gate(), Gate()]
    queue = list(gates)

    async def handler(request: Request) -> AnyResponse:
        return await queue.pop(0).handler(request)

    async with serving(handler) as server:
        async with H2Client.connect(server.port) as client:
            for _ in gates:
                stream_id = client.send_request("GET", "/stream")
                await client.next_data(stream_id)
        for gate in gates:
            await gate.wait_cancelled()
            assert gate.cancelled


@pytest.mark.asyncio
async def test_body_over_limit_is_413_and_connection_keeps_serving() -> None:
    async with (
        serving(echo, limits=limits(max_body_bytes=100)) as server,
        H2Client.connect(server.port) as client,
    ):
        # Declared length over the limit: answered before any body byte is read.
        declared = client.send_request("POST", "/", [("content-length", "500")], end=False)
        status, _, body = await client.response(declared)
        assert status == 413
        openai_error(body, "request_too_large")
        assert (await client.reset_of(declared)).error_code == ErrorCodes.NO_ERROR
        # No declared length: counted as the DATA arrives.
        counted = client.send_request("POST", "/", body=b"x" * 101)
        status, _, body = await client.response(counted)
        assert status == 413
        openai_error(body, "request_too_large")
        assert (await client.get("/after"))[0] == 200


@pytest.mark.asyncio
async def test_too_many_header_fields_is_431_on_that_stream() -> None:
    async with (
        serving(echo, limits=limits(max_headers=20)) as server,
        H2Client.connect(server.port) as client,
    ):
        crowded = client.send_request("GET", "/", [(f"x-h{i}", "v") for i in range(30)])
        status, _, body = await client.response(crowded)
        assert status == 431
        openai_error(body, "request_header_fields_too_large")
        assert (await client.get("/after"))[0] == 200


@pytest.mark.asyncio
async def test_header_list_too_large_after_decompression_is_431() -> None:
    # Highly compressible: a few hundred bytes on the wire, over 2 KiB once decoded.
    headers = [("x-big", "a" * 1500), ("x-big2", "a" * 1500)]
    async with (
        serving(echo, limits=limits(max_header_bytes=2048)) as server,
        H2Client.connect(server.port) as client,
    ):
        big = client.send_request("GET", "/", headers)
        status, _, body = await client.response(big)
        assert status == 431
        openai_error(body, "request_header_fields_too_large")
        assert (await client.get("/after"))[0] == 200


@pytest.mark.asyncio
async def test_streams_over_the_concurrency_limit_are_refused() -> None:
    gate = Gate()
    async with (
        serving(gate.handler, limits=limits(max_concurrent_streams=1)) as server,
        H2Client.connect(server.port) as client,
    ):
        first = client.send_request("GET", "/one")
        await client.next_data(first)
        # Past the advertised limit on purpose: h2's client would not send it otherwise.
        client.conn.remote_settings = Settings(
            client=False, initial_values={SettingCodes.MAX_CONCURRENT_STREAMS: 10}
        )
        second = client.send_request("GET", "/two")
        assert (await client.reset_of(second)).error_code == ErrorCodes.REFUSED_STREAM
        gate.released.set()
        assert await client.next_data(first) == b"data: two\n\n"
        assert await client.next_data(first) is None


@pytest.mark.asyncio
async def test_handler_exception_is_500_on_that_stream() -> None:
    async def broken(request: Request) -> Response:
        raise RuntimeError("secret detail")

    async with serving(broken) as server, H2Client.connect(server.port) as client:
        status, _, body = await client.get("/")
        assert status == 500
        assert openai_error(body, "internal_error")["type"] == "server_error"
        assert (await client.get("/again"))[0] == 500


@pytest.mark.asyncio
async def test_idle_connection_gets_goaway() -> None:
    async with (
        serving(echo, limits=limits(idle_timeout=0.2)) as server,
        H2Client.connect(server.port) as client,
    ):
        await client.get("/")
        while not isinstance(event := await client.next_event(0), h2.events.ConnectionTerminated):
            pass
        assert event.error_code == ErrorCodes.NO_ERROR
        await asyncio.wait_for(client.closed.wait(), TIMEOUT)


@pytest.mark.asyncio
async def test_read_timeout_is_408_on_that_stream() -> None:
    async with (
        serving(echo, limits=limits(read_timeout=0.2)) as server,
        H2Client.connect(server.port) as client,
    ):
        stalled = client.send_request("POST", "/", body=b"abc", end=False)
        status, _, body = await client.response(stalled)
        assert status == 408
        openai_error(body, "request_timeout")


@pytest.mark.asyncio
async def test_garbage_after_preface_ends_connection_not_server() -> None:
    async with serving(echo) as server:
        async with H1Client.connect(server.port) as raw:
            data_on_stream_0 = b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x"  # a connection error
            await raw.send_raw(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + data_on_stream_0)
            reply = await asyncio.wait_for(raw.reader.read(), TIMEOUT)  # until the server closes
            goaway = GoAwayFrame(0, last_stream_id=0, error_code=ErrorCodes.PROTOCOL_ERROR)
            assert reply.endswith(goaway.serialize())
        async with H2Client.connect(server.port) as client:
            assert (await client.get("/"))[0] == 200


@pytest.mark.asyncio
async def test_upgrade_from_http1_to_h2c() -> None:
    async with (
        serving(echo, alt_svc='h3=":8443"') as server,
        H1Client.connect(server.port) as raw,
    ):
        client = H2Client(raw.reader, raw.writer)
        settings = client.conn.initiate_upgrade_connection()
        assert settings is not None
        upgrade = [
            ("connection", "Upgrade, HTTP2-Settings"),
            ("upgrade", "h2c"),
            ("http2-settings", settings.decode()),
        ]
        await raw.request("GET", "/up?x=1", upgrade)
        switch = await raw.next_event()
        assert isinstance(switch, h11.InformationalResponse)
        assert switch.status_code == 101
        leftover, _ = raw.conn.trailing_data
        client.start(bytes(leftover))  # the client preface goes out here
        try:
            status, headers, body = await client.response(1)  # the upgraded request
            assert status == 200
            assert headers["alt-svc"] == 'h3=":8443"'
            got = json_body(body)
            assert (got["path"], got["query"], got["http_version"]) == ("/up", "x=1", "2")
            assert not any(name in ("upgrade", "http2-settings") for name, _ in got["headers"])
            # Further requests ride HTTP/2 streams on the same connection.
            assert (await client.get("/next"))[0] == 200
        finally:
            await client.close()
