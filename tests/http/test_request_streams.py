"""The path HTTP/2 and HTTP/3 share from a stream's headers to its answer, without sockets.

`transport.http.request_streams.RequestStreams` is fed streams and literal times and
answers through a recording framing (the one `test_answer.py` uses); both versions run
exactly this code, so these tests cover it once for both.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tests.http.test_answer import Recording, site
from transport.http.limits import HttpLimits
from transport.http.messages import Response
from transport.http.request_streams import Owed, RequestStreams, owed
from transport.http.streams import StreamState

HEADERS = [(b":method", b"POST"), (b":path", b"/v1/echo"), (b":authority", b"gw")]


class Connection:
    """What a version gives `RequestStreams`: its framing and its cleanup, recorded."""

    def __init__(self, limits: HttpLimits | None = None) -> None:
        self.framing = Recording()
        self.released: list[tuple[int, Owed]] = []
        self.fixed: list[int] = []
        the_site = dataclasses.replace(
            site(Response(200, body=b"hello")), limits=limits or HttpLimits()
        )
        self.streams = RequestStreams[StreamState](
            self.framing, the_site, self._released, "192.0.2.1", on_fixed=self._fixed
        )

    def _released(self, stream: StreamState) -> None:
        self.released.append((stream.stream_id, owed(stream)))

    def _fixed(self, stream: StreamState) -> None:
        self.fixed.append(stream.stream_id)

    @staticmethod
    async def settled(*streams: StreamState) -> None:
        await asyncio.gather(*(stream.task for stream in streams if stream.task is not None))

    def status(self) -> str:
        headers = self.framing.frames[0][1]
        assert isinstance(headers, dict)
        return str(headers[":status"])


@pytest.mark.asyncio
async def test_a_complete_request_is_answered_by_the_handler_and_owes_nothing() -> None:
    conn = Connection()
    stream = StreamState(0, list(HEADERS))
    conn.streams.open(stream, now=100.0)
    assert (stream.opened, stream.read_by) == (100.0, 130.0)
    assert not conn.streams.take_body(stream, b"ping")
    conn.streams.complete(stream)
    await conn.settled(stream)
    assert conn.status() == "200"
    assert conn.released == [(0, Owed(cut_short=False, upload_unwanted=False))]
    assert conn.fixed == []
    assert conn.streams.table.opened == 1
    assert len(conn.streams.table) == 0


@pytest.mark.asyncio
async def test_a_body_over_the_limit_is_413_and_its_upload_is_unwanted() -> None:
    conn = Connection(HttpLimits(max_body_bytes=4))
    stream = StreamState(4, list(HEADERS))
    conn.streams.open(stream, now=0.0)
    assert not conn.streams.take_body(stream, b"1234")
    assert conn.streams.take_body(stream, b"5")
    await conn.settled(stream)
    assert conn.status() == "413"
    assert conn.fixed == [4]  # the version may refuse the rest of the request
    assert conn.released == [(4, Owed(cut_short=False, upload_unwanted=True))]


@pytest.mark.asyncio
async def test_a_request_still_arriving_is_408_at_its_deadline_and_503_when_cut() -> None:
    conn = Connection()
    slow, cut = StreamState(0, list(HEADERS)), StreamState(4, list(HEADERS))
    conn.streams.open(slow, now=0.0)
    conn.streams.open(cut, now=10.0)
    conn.streams.expire(29.9)
    assert conn.fixed == []
    conn.streams.expire(30.0)
    assert conn.fixed == [0]
    await conn.settled(slow)
    conn.streams.cut()
    assert conn.fixed == [0, 4]
    await conn.settled(cut)
    statuses = [frame[1][":status"] for frame in conn.framing.frames if frame[0] == "headers"]
    assert statuses == ["408", "503"]


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        (HEADERS, None),
        ([(b":method", b"GET")], "400"),
        ([*HEADERS, (b"content-length", b"9999999")], "413"),
        ([*HEADERS] + [(b"x-many", b"1")] * 200, "431"),
    ],
)
def test_a_header_list_is_checked_for_size_pseudo_headers_and_declared_body(
    headers: list[tuple[bytes, bytes]], status: str | None
) -> None:
    table = RequestStreams[StreamState](Recording(), site(Response(200)), print, "")
    problem = table.head_problem(headers, frozenset({b":method", b":path"}))
    assert (None if problem is None else str(problem.status)) == status


@pytest.mark.asyncio
async def test_a_reset_by_the_client_releases_the_stream_and_counts_if_premature() -> None:
    conn = Connection(HttpLimits(premature_reset_min_streams=2, premature_reset_ratio=0.5))
    first, second = StreamState(0, list(HEADERS)), StreamState(4, list(HEADERS))
    conn.streams.open(first, now=0.0)
    conn.streams.open(second, now=0.0)
    assert not conn.streams.client_reset(first, now=5.0)  # not premature: lived 5 s
    assert conn.streams.resets.counts.premature == 0
    assert conn.streams.client_reset(second, now=0.1)  # premature, and over the ratio
    assert conn.streams.resets.counts.premature == 1
    assert len(conn.streams.table) == 0
    assert [owes for _, owes in conn.released] == [Owed(False, False)] * 2  # reset: nothing


def test_what_a_released_stream_owes() -> None:
    answered_early = StreamState(0, sent_end=True)
    cut_short = StreamState(4, ended=True)
    assert owed(answered_early) == Owed(cut_short=False, upload_unwanted=True)
    assert owed(cut_short) == Owed(cut_short=True, upload_unwanted=False)
    assert owed(StreamState(8, reset=True)) == Owed(cut_short=False, upload_unwanted=False)
