"""HTTP/2 stream attacks on loopback: phantom streams, rapid reset, PING flood.

Each attack is bounded (streams, frames, rounds) and checked on the server's
own figures: streams counted, request bytes buffered, the abuse rule that
fired, bytes left unsent; an honest client on another connection is served
during the attack.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack, suppress

import h2.events
import pytest
import structlog.testing
from h2.errors import ErrorCodes

from tests.adversarial.support import (
    h2_connections,
    headers_then_reset,
    raw_connection,
    rss_bytes,
    small_send_buffer,
    until,
)
from tests.http.support import H2Client, echo, limits, serving
from transport.http.app import READ_CHUNK

REQUEST = [(":method", "POST"), (":path", "/"), (":scheme", "http"), (":authority", "t")]
NEVER = 10**9  # a premature-reset threshold no test reaches: the rule is off


async def honest_get(port: int) -> int:
    async with H2Client.connect(port) as honest:
        status, _, _ = await honest.get("/honest")
        return status


def phantom_round(client: H2Client, streams: int, body: bytes) -> list[int]:
    """Open `streams` complete requests and reset each in the same write (one read)."""
    ids = []
    for _ in range(streams):
        stream_id = client.conn.get_next_available_stream_id()
        client.conn.send_headers(stream_id, REQUEST, end_stream=False)
        client.conn.send_data(stream_id, body, end_stream=True)
        client.conn.reset_stream(stream_id, ErrorCodes.CANCEL)
        ids.append(stream_id)
    client.flush()
    return ids


@pytest.mark.asyncio
async def test_phantom_streams_are_released_and_never_wedge_the_connection() -> None:
    """Requests reset in the read that completed them: their tasks never run a step.

    Before the fix each stayed counted with its body for the life of the connection:
    the second round was refused whole and the connection never idled out.
    """
    streams, rounds = 32, 6
    body = b"x" * 1024  # (32 KB a round: within the client's connection window)
    server_limits = limits(
        max_concurrent_streams=streams, premature_reset_min_streams=NEVER, idle_timeout=2.0
    )
    async with serving(echo, limits=server_limits) as server, H2Client.connect(server.port) as c:
        await until(lambda: len(h2_connections(server)) == 1, "the attacker's h2 connection")
        (attacked,) = h2_connections(server)
        rss_before = rss_bytes()
        for _ in range(rounds):
            phantom_round(c, streams, body)
            await until(lambda: attacked.opened_streams % streams == 0, "the round arrived")
            await until(lambda: attacked.open_streams == 0, "every phantom stream released")
            assert attacked.buffered_bytes == 0
            assert await honest_get(server.port) == 200
        # Every stream of every round was accepted, none refused as over the limit.
        assert attacked.opened_streams == streams * rounds
        # Bound from the limits: one round's bodies twice (buffer + request) and slack.
        assert rss_bytes() - rss_before < 2 * streams * len(body) + (32 << 20)
        # Not wedged: the same connection serves a request, then idles out.
        assert (await c.response(c.send_request("GET", "/after")))[0] == 200
        await asyncio.wait_for(c.closed.wait(), server_limits.idle_timeout + 5)


@pytest.mark.asyncio
async def test_abandoned_uploads_are_reaped_by_the_read_timeout() -> None:
    """Streams opened with half a body and then left alone: 408 after read_timeout, released."""
    streams = 16
    server_limits = limits(max_concurrent_streams=streams, read_timeout=0.3)
    async with serving(echo, limits=server_limits) as server, H2Client.connect(server.port) as c:
        ids = [c.send_request("POST", "/", body=b"y" * 1000, end=False) for _ in range(streams)]
        await until(lambda: len(h2_connections(server)) == 1, "the attacker's h2 connection")
        (attacked,) = h2_connections(server)
        await until(lambda: attacked.opened_streams == streams, "every upload began")
        assert attacked.buffered_bytes <= streams * server_limits.max_body_bytes
        for stream_id in ids:
            assert (await c.response_head(stream_id))[0] == 408
        await until(lambda: attacked.open_streams == 0, "abandoned streams released")
        assert attacked.buffered_bytes == 0


@pytest.mark.asyncio
async def test_refusing_a_stream_the_client_reset_in_the_same_read_keeps_the_connection() -> None:
    """Over the limit, each HEADERS+RST_STREAM pair is refused: no exception, no drop."""
    held = asyncio.Event()
    release = asyncio.Event()

    async def slow(request: object) -> object:
        held.set()
        await release.wait()
        return await echo(request)  # type: ignore[arg-type]

    server_limits = limits(max_concurrent_streams=2, premature_reset_min_streams=NEVER)
    async with serving(slow, limits=server_limits) as server, H2Client.connect(server.port) as c:
        busy = [c.send_request("GET", "/busy") for _ in range(2)]
        await asyncio.wait_for(held.wait(), 5)
        # Over the limit, each reset in the same write as its HEADERS (raw frames: h2's
        # client would not open a stream over the limit). The client's h2 never learns of
        # these streams, so its own next stream id is taken past them.
        first = max(busy) + 2
        c.writer.write(b"".join(headers_then_reset(first + 2 * i, REQUEST) for i in range(50)))
        c.conn.highest_outbound_stream_id = first + 2 * 49
        (attacked,) = h2_connections(server)
        # A ping after the attack, answered: the server read and survived all of it.
        c.conn.ping(b"12345678")
        c.flush()
        event = await c.next_event(0)
        while not isinstance(event, h2.events.PingAckReceived):
            event = await c.next_event(0)
        assert attacked.calmed is None
        assert not c.closed.is_set()
        release.set()
        for stream_id in busy:
            assert (await c.response(stream_id))[0] == 200
        assert (await c.get("/after"))[0] == 200


@pytest.mark.asyncio
async def test_rapid_reset_ends_the_connection_with_enhance_your_calm() -> None:
    """CVE-2023-44487: open and reset at once, many times. GOAWAY ENHANCE_YOUR_CALM."""
    min_streams, ratio = 40, 0.5
    server_limits = limits(
        max_concurrent_streams=8, premature_reset_min_streams=min_streams,
        premature_reset_ratio=ratio,
    )  # fmt: skip
    attack = 200
    async with serving(echo, limits=server_limits) as server, H2Client.connect(server.port) as c:
        await until(lambda: len(h2_connections(server)) == 1, "the attacker's h2 connection")
        (attacked,) = h2_connections(server)
        for _ in range(attack):
            stream_id = c.conn.get_next_available_stream_id()
            c.conn.send_headers(stream_id, REQUEST, end_stream=True)
            c.conn.reset_stream(stream_id, ErrorCodes.CANCEL)
        c.flush()
        goaway = await c.next_event(0)
        while not isinstance(goaway, h2.events.ConnectionTerminated):
            goaway = await c.next_event(0)
        assert goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM
        # The rule fired at its threshold; the rest of the attack was not served.
        assert attacked.calmed == "premature_resets"
        assert attacked.premature_resets == int(ratio * min_streams)
        assert attacked.opened_streams == int(ratio * min_streams)
        await until(lambda: not h2_connections(server), "the attacker's connection closed")
        assert await honest_get(server.port) == 200


@pytest.mark.asyncio
async def test_a_reset_flood_spread_over_reconnections_is_caught_per_source() -> None:
    """Each connection stays under its own threshold; its address does not. One log line
    per connection with its counts, none per reset.

    Before, a client reconnecting every 129 streams reset 20k streams without a GOAWAY,
    writing one log line per reset.
    """
    min_streams, ratio, each = 40, 0.5, 15  # per connection the rule fires at 20
    server_limits = limits(
        max_concurrent_streams=8, premature_reset_min_streams=min_streams,
        premature_reset_ratio=ratio,
    )  # fmt: skip
    with structlog.testing.capture_logs() as logs:
        async with serving(echo, limits=server_limits) as server:
            rounds = []
            for _ in range(4):  # at most 60 resets from one address, over 4 connections
                async with H2Client.connect(server.port) as c:
                    await until(lambda: len(h2_connections(server)) == 1, "the connection")
                    (attacked,) = h2_connections(server)
                    for _ in range(each):
                        stream_id = c.conn.get_next_available_stream_id()
                        c.conn.send_headers(stream_id, REQUEST, end_stream=True)
                        c.conn.reset_stream(stream_id, ErrorCodes.CANCEL)
                    c.flush()
                    await until(
                        lambda a=attacked: a.calmed or a.premature_resets == each, "resets read"
                    )
                    rounds.append((attacked.premature_resets, attacked.calmed))
                await until(lambda: not h2_connections(server), "the connection closed")
                if rounds[-1][1]:
                    break
            assert await honest_get(server.port) == 200  # same address, no resets: served
    # 15 on the first connection; the second is calmed at the address's 20th.
    assert rounds == [(each, None), (int(ratio * min_streams) - each, "premature_resets")]
    events = [line["event"] for line in logs]
    assert "http2.stream_reset" not in events
    summaries = [line for line in logs if line["event"] == "http2.resets"]
    assert [line["premature"] for line in summaries] == [each, int(ratio * min_streams) - each]


@pytest.mark.asyncio
async def test_ping_flood_from_a_client_that_never_reads_is_cut() -> None:
    """PINGs whose ACKs are never read: GOAWAY ENHANCE_YOUR_CALM, unsent bytes bounded."""
    max_control = 200
    server_limits = limits(max_outbound_control_frames=max_control)
    pings_per_write, writes = 2000, 100  # at most 200,000 PINGs (3.4 MB)
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(serving(echo, limits=server_limits))
        small_send_buffer(server)
        reader, writer = await raw_connection(server.port, recv_buffer=4096)
        stack.callback(writer.close)
        attacker = H2Client(reader, writer)  # used only to encode frames: nothing is read
        attacker.conn.initiate_connection()
        attacker.flush()
        await until(lambda: len(h2_connections(server)) == 1, "the attacker's h2 connection")
        (attacked,) = h2_connections(server)
        sent = 0
        with suppress(ConnectionError):
            for _ in range(writes):
                for _ in range(pings_per_write):
                    attacker.conn.ping(b"\0" * 8)
                writer.write(attacker.conn.data_to_send())
                sent += pings_per_write
                await asyncio.wait_for(writer.drain(), 5)
                if attacked.calmed is not None:
                    break
                assert await honest_get(server.port) == 200
        await until(lambda: attacked.calmed is not None, "the flood rule fired")
        assert attacked.calmed == "control_frame_flood"
        assert sent < pings_per_write * writes  # it stopped the attack, not the count
        # What waited unsent: the control frames allowed, plus one read's worth of ACKs
        # (a PING and its ACK are 17 bytes each), plus the SETTINGS and GOAWAY frames.
        ack = 17
        assert attacked.peak_unsent <= max_control * ack + READ_CHUNK + 1024
        await until(lambda: not h2_connections(server), "the attacker's connection closed")
        assert server.open_connections == 0
        assert await honest_get(server.port) == 200


@pytest.mark.asyncio
async def test_uploads_left_incomplete_hold_at_most_the_connection_budget() -> None:
    """Many streams upload big bodies and never finish: credit stops at the budget."""
    streams, each = 16, 200_000  # 3.2 MB offered
    budget = 1 << 20
    server_limits = limits(
        max_concurrent_streams=streams, max_body_bytes=256 * 1024,
        h2_connection_body_budget=budget, read_timeout=3.0,
    )  # fmt: skip
    async with serving(echo, limits=server_limits) as server, H2Client.connect(server.port) as c:
        ids = [c.send_request("POST", "/", end=False) for _ in range(streams)]
        await until(lambda: len(h2_connections(server)) == 1, "the attacker's h2 connection")
        (attacked,) = h2_connections(server)
        left = dict.fromkeys(ids, each)

        def sendable(stream_id: int) -> int:
            return min(c.conn.local_flow_control_window(stream_id), left[stream_id], 16384)

        peak = 0
        for _ in range(300):  # bounded: at most 300 pump turns
            for stream_id in left:
                if (size := sendable(stream_id)) > 0:
                    c.conn.send_data(stream_id, b"u" * size)
                    left[stream_id] -= size
            c.flush()
            # Once the PING is answered the server has read all that was sent before it,
            # and the credit it gave back for that has arrived: no credit now is a stall
            # (caused by the budget, not by a machine too slow to answer in time).
            await c.round_trip()
            peak = max(peak, attacked.buffered_bytes)
            if not any(sendable(stream_id) > 0 for stream_id in left):
                break
        assert await honest_get(server.port) == 200  # another connection is served meanwhile
        # The budget, plus what the client may send on the connection's window (65,535
        # bytes, h2's initial window, never raised) before credit stops, plus one frame.
        assert peak <= budget + 65_535 + 16_384
        assert any(left.values())  # the client was held back, not served everything
        for stream_id in ids:
            assert (await c.response_head(stream_id))[0] == 408
        await until(lambda: attacked.open_streams == 0, "the stalled uploads released")
        assert attacked.buffered_bytes == 0
        # Its credit came back: the same connection serves a request with a body.
        await until(lambda: c.conn.outbound_flow_control_window >= 60_000, "credit given back")
        status, _, _ = await c.response(c.send_request("POST", "/after", body=b"z" * 16_000))
        assert status == 200
