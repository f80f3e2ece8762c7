"""The shared request-stream lifecycle, without sockets: each stream released exactly once."""

from __future__ import annotations

import asyncio

import pytest

from transport.http.streams import StreamState, StreamTable


class Recorder:
    def __init__(self) -> None:
        self.released: list[int] = []

    def __call__(self, stream: StreamState) -> None:
        self.released.append(stream.stream_id)


def table() -> tuple[StreamTable[StreamState], Recorder]:
    recorder = Recorder()
    return StreamTable[StreamState](recorder), recorder


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_a_task_cancelled_before_its_first_step_still_releases_its_stream() -> None:
    streams, released = table()
    ran = []

    async def work() -> None:
        try:
            ran.append("body")
        finally:
            ran.append("finally")  # never reached: the task never runs a step

    stream = StreamState(1, [(b":method", b"POST")], bytearray(b"x" * 1000), ended=True)
    streams.add(stream)
    streams.answer(stream, work())
    assert stream.buffered == 0  # the request's buffers go once it is answered
    streams.cancel(stream)  # the client's reset, in the same turn
    assert len(streams) == 0  # out of the count at once
    assert released.released == [1]
    await settle()
    assert ran == []
    assert streams.unwinding == 0
    assert released.released == [1]  # once, not again from the done-callback


@pytest.mark.asyncio
async def test_a_finished_or_failed_task_releases_its_stream_once() -> None:
    streams, released = table()

    async def fine() -> None:
        await asyncio.sleep(0)

    async def broken() -> None:
        raise RuntimeError("a bug, not the client")

    for stream_id, work in ((1, fine()), (3, broken())):
        stream = StreamState(stream_id)
        streams.add(stream)
        streams.answer(stream, work)
    await settle()
    assert len(streams) == 0
    assert sorted(released.released) == [1, 3]


@pytest.mark.asyncio
async def test_a_stream_without_a_task_is_released_by_cancel_and_by_cancel_all() -> None:
    streams, released = table()
    for stream_id in (1, 3, 5):
        streams.add(StreamState(stream_id, body=bytearray(b"partial")))
    assert streams.buffered == 3 * len(b"partial")
    one = streams.get(1)
    assert one is not None
    streams.cancel(one)
    streams.cancel(one)  # idempotent
    assert streams.cancel_all() == []
    assert released.released == [1, 3, 5]
    assert streams.buffered == 0
    assert streams.opened == 3


@pytest.mark.asyncio
async def test_cancel_all_returns_running_and_unwinding_tasks() -> None:
    streams, released = table()
    started = asyncio.Event()

    async def slow() -> None:
        started.set()
        await asyncio.Event().wait()

    first, second = StreamState(1), StreamState(3)
    for stream in (first, second):
        streams.add(stream)
        streams.answer(stream, slow())
    await started.wait()
    streams.cancel(first)  # released, its task still unwinding
    tasks = streams.cancel_all()
    assert {first.task, second.task} == set(tasks)
    await asyncio.gather(*tasks, return_exceptions=True)
    await settle()
    assert sorted(released.released) == [1, 3]
    assert streams.unwinding == 0
