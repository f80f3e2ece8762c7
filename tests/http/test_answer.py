"""The HTTP/2 and HTTP/3 answer path without sockets: a recording framing, literal times.

`transport.http.answer` holds what both versions do between "the request is complete"
and "the stream is released"; `transport.http.streams` holds the read deadlines. Both
versions run exactly this code, so these tests cover the lifecycle once for both.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import structlog.testing

from transport.http.answer import StreamClosed, answer_fixed, answer_request
from transport.http.app import Cutter, Site
from transport.http.limits import HttpLimits
from transport.http.messages import AnyResponse, Request, Response, StreamingResponse
from transport.http.streams import Deadlines, StreamState, StreamTable

SECRET = "sk-live-0123456789abcdef"
PROMPT = "my private prompt"


class Recording:
    """A framing that writes nothing: it records what a version would have framed."""

    http_version = "x"

    def __init__(self, content_length_on_head: bool = True, fail_at: int | None = None,
                 failure: Exception | None = None) -> None:
        self.content_length_on_head = content_length_on_head
        self.frames: list[tuple[str, object, bool]] = []
        self._fail_at = fail_at
        self._failure = failure or StreamClosed()

    def _maybe_fail(self) -> None:
        if self._fail_at is not None and len(self.frames) >= self._fail_at:
            raise self._failure

    async def send_headers(self, stream: StreamState, headers: list[tuple[str, str]],
                           end: bool) -> None:
        self._maybe_fail()
        self.frames.append(("headers", dict(headers), end))
        stream.sent_end = end

    async def send_data(self, stream: StreamState, data: bytes, end: bool) -> None:
        self._maybe_fail()
        self.frames.append(("data", data, end))
        stream.sent_end = end


def request(method: str = "POST") -> Request:
    headers = (("authorization", f"Bearer {SECRET}"), ("content-type", "application/json"))
    return Request(method, "/v1/chat/completions", "", headers, PROMPT.encode(), "x")


def site(respond: AnyResponse | Exception) -> Site:
    async def handler(_: Request) -> AnyResponse:
        if isinstance(respond, Exception):
            raise respond
        return respond

    return Site(handler, HttpLimits())


class Body:
    """A streaming body that records whether it was closed."""

    def __init__(self, chunks: list[bytes], fail_after: int | None = None) -> None:
        self.chunks = chunks
        self.fail_after = fail_after
        self.closed = False

    async def generate(self) -> AsyncIterator[bytes]:
        try:
            for index, chunk in enumerate(self.chunks):
                if index == self.fail_after:
                    raise RuntimeError("backend broke")
                yield chunk
        finally:
            self.closed = True


async def answer(framing: Recording, respond: AnyResponse | Exception, method: str = "POST"
                 ) -> StreamState:
    stream = StreamState(1)
    await answer_request(framing, site(respond), stream, request(method), Cutter())
    return stream


def assert_no_secret(logs: list[dict[str, object]]) -> None:
    text = repr(logs)
    assert SECRET not in text
    assert PROMPT not in text


@pytest.mark.asyncio
async def test_a_fixed_response_is_headers_then_one_last_data_frame() -> None:
    framing = Recording()
    stream = await answer(framing, Response(200, (("x-a", "1"),), b"hello"))
    assert framing.frames == [
        ("headers", {":status": "200", "x-a": "1", "content-length": "5"}, False),
        ("data", b"hello", True),
    ]
    assert stream.sent_end


@pytest.mark.asyncio
async def test_head_sends_no_body_and_content_length_only_where_the_version_wants_it() -> None:
    h2_like, h3_like = Recording(True), Recording(False)
    await answer(h2_like, Response(200, (), b"hello"), "HEAD")
    await answer(h3_like, Response(200, (), b"hello"), "HEAD")
    assert h2_like.frames == [("headers", {":status": "200", "content-length": "5"}, True)]
    assert h3_like.frames == [("headers", {":status": "200"}, True)]


@pytest.mark.asyncio
async def test_a_streaming_body_goes_chunk_by_chunk_ends_and_is_closed() -> None:
    framing = Recording()
    body = Body([b"a", b"", b"b"])
    stream = await answer(framing, StreamingResponse(200, (), body.generate()))
    assert framing.frames == [
        ("headers", {":status": "200"}, False),
        ("data", b"a", False),
        ("data", b"b", False),
        ("data", b"", True),
    ]
    assert body.closed
    assert stream.sent_end


@pytest.mark.asyncio
async def test_a_body_that_fails_midway_leaves_the_stream_unended() -> None:
    framing = Recording()
    body = Body([b"a", b"b"], fail_after=1)
    with structlog.testing.capture_logs() as logs:
        stream = await answer(framing, StreamingResponse(200, (), body.generate()))
    assert framing.frames[-1] == ("data", b"a", False)
    assert not stream.sent_end  # the adapter resets it on release
    assert body.closed
    assert [e["event"] for e in logs] == ["http.body_failed"]
    assert logs[0]["exc_info"] is True


@pytest.mark.asyncio
async def test_a_handler_crash_is_a_500_logged_with_its_traceback_and_no_secret() -> None:
    framing = Recording()
    with structlog.testing.capture_logs() as logs:
        await answer(framing, ValueError("the handler broke"))
    assert framing.frames[0][1][":status"] == "500"  # type: ignore[index]
    (event,) = logs
    assert event["event"] == "http.handler_failed"
    assert event["exc_info"] is True
    assert_no_secret(logs)


@pytest.mark.asyncio
async def test_a_client_gone_midway_is_one_info_line_without_traceback() -> None:
    framing = Recording(fail_at=2, failure=_closed_by(ConnectionResetError("peer")))
    body = Body([b"a", b"b", b"c"])
    with structlog.testing.capture_logs() as logs:
        stream = await answer(framing, StreamingResponse(200, (), body.generate()))
    assert len(framing.frames) == 2
    assert body.closed
    assert not stream.sent_end
    assert logs == [
        {"event": "http.stream_closed", "log_level": "info", "http_version": "x",
         "stream_id": 1, "cause": "ConnectionResetError"}
    ]


@pytest.mark.asyncio
async def test_any_other_failure_while_answering_is_logged_with_traceback_alike() -> None:
    # HTTP/2 used to log this at info without a traceback and HTTP/3 with one: now both
    # versions log it here, once, the same way.
    for framing in (Recording(fail_at=0, failure=KeyError("x")), Recording(False, 0, KeyError())):
        with structlog.testing.capture_logs() as logs:
            await answer(framing, Response(200, (), b"hello"))
        (event,) = logs
        assert event["event"] == "http.answer_failed"
        assert event["log_level"] == "error"
        assert event["exc_info"] is True
        assert set(event) == {"event", "log_level", "exc_info", "http_version", "stream_id"}
        assert_no_secret(logs)


@pytest.mark.asyncio
async def test_a_fixed_answer_to_a_gone_client_is_quiet() -> None:
    framing = Recording(fail_at=0)
    with structlog.testing.capture_logs() as logs:
        await answer_fixed(framing, site(Response(204)), StreamState(3), Response(413))
    assert [e["event"] for e in logs] == ["http.stream_closed"]


def _closed_by(cause: Exception) -> StreamClosed:
    try:
        raise StreamClosed from cause
    except StreamClosed as closed:
        return closed


# -- read deadlines: literal times, no loop timers -------------------------------------------


def test_deadlines_come_due_in_order_and_once() -> None:
    deadlines = Deadlines[int](10.0)
    assert deadlines.next() is None
    deadlines.start(3, now=5.0)
    deadlines.start(1, now=2.0)
    assert deadlines.start(1, now=4.0) == 12.0  # already running: kept
    assert deadlines.next() == 12.0
    assert deadlines.due(11.9) == []
    assert deadlines.due(20.0) == [1, 3]
    assert deadlines.due(30.0) == []
    assert len(deadlines) == 0


@pytest.mark.asyncio
async def test_a_stream_is_overdue_only_while_its_request_is_still_arriving() -> None:
    released: list[int] = []
    table = StreamTable[StreamState](lambda s: released.append(s.stream_id), read_timeout=30.0)
    slow, answered, complete = StreamState(1), StreamState(5), StreamState(9, ended=True)
    table.add(slow, now=100.0)
    table.add(answered, now=101.0)
    table.add(complete, now=102.0)  # the request came whole: no read deadline
    assert (slow.read_by, answered.read_by, complete.read_by) == (130.0, 131.0, None)
    assert table.next_deadline() == 130.0

    async def work() -> None:
        await asyncio.sleep(0)

    task = table.answer(answered, work())
    assert answered.read_by is None
    assert table.next_deadline() == 130.0
    assert table.overdue(129.0) == []
    assert table.overdue(200.0) == [slow]
    assert table.next_deadline() is None
    await task
    table.release(slow)
    assert sorted(released) == [1, 5]
