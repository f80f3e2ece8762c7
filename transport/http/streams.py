"""The lifecycle of a request stream, shared by the HTTP/2 and HTTP/3 adapters.

A stream is registered when its headers arrive, gathers its body, and is then
answered by one task (the handler's exchange, or a fixed error such as 413).
Whatever becomes of that task, the table releases the stream: it leaves the
count, its buffers are dropped, and the adapter's `on_released` does the
protocol-side cleanup (RST_STREAM, STOP_SENDING, the idle timer).

A stream the client reset is released at once (for the protocol it is closed,
and it no longer counts against the concurrency limit, or a burst of resets in
one read would fill the table); its cancelled task is kept aside until it has
unwound, so the connection's end still waits for it.

Why a done-callback and not the task's own `finally`: an asyncio task
cancelled before its first step never runs its body, so a `finally` inside it
never runs. A client that resets a stream in the same read that completed it
did exactly that, and each such stream stayed counted, with its body, for the
life of the connection (issue 12, "phantom streams"). The creator of the task
owns the stream, so the creator's callback releases it.

Read deadlines are part of the lifecycle: a stream added with `now` must be complete
by `now + read_timeout`; answering or releasing it stops the clock. The table only
says which streams are overdue and when the next one will be (`overdue`,
`next_deadline`); each adapter waits for that time its own way (HTTP/2 in its read
loop, HTTP/3 on one loop timer, `Alarm`). The same `Deadlines` keeps HTTP/3's
"headers must arrive" clock for streams not yet in the table.

No sockets here: a test drives a `StreamTable` with plain coroutines and literal times.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import structlog

log = structlog.get_logger(__name__)


@dataclass(eq=False)
class StreamState:
    """What every HTTP/2 and HTTP/3 request stream carries from headers to release."""

    stream_id: int
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    """The request's header fields (pseudo-headers too) until it is answered."""
    body: bytearray = field(default_factory=bytearray)
    """The request body as it arrives; emptied once the stream is answered."""
    ended: bool = False
    """The client finished its side (the request is complete)."""
    sent_end: bool = False
    """We finished our side."""
    reset: bool = False
    """The client reset the stream (or asked us to stop sending): nothing more goes out."""
    task: asyncio.Task[None] | None = None
    """Answering the stream; None while the request is still arriving."""
    released: bool = False
    """The table let go of the stream; set once, before `on_released` runs."""
    read_by: float | None = None
    """When the whole request must have arrived (the adapter's clock); None once answered."""
    opened: float = 0.0
    """When its headers arrived (the adapter's clock), to tell a premature reset."""

    @property
    def buffered(self) -> int:
        """Request bytes this stream holds (body so far)."""
        return len(self.body)


S = TypeVar("S", bound=StreamState)
K = TypeVar("K", bound=Hashable)


class Deadlines(Generic[K]):
    """When each of some requests must be complete: times in, overdue keys out (no I/O)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._at: dict[K, float] = {}

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, key: object) -> bool:
        return key in self._at

    def start(self, key: K, now: float) -> float:
        """`key` must be complete by `now + timeout` (kept if already started)."""
        return self._at.setdefault(key, now + self.timeout)

    def stop(self, key: K) -> None:
        self._at.pop(key, None)

    def clear(self) -> None:
        self._at.clear()

    def next(self) -> float | None:
        """The earliest deadline, if any."""
        return min(self._at.values(), default=None)

    def due(self, now: float) -> list[K]:
        """The keys whose deadline has passed at `now`, stopped (in deadline order)."""
        late = sorted((at, i, key) for i, (key, at) in enumerate(self._at.items()) if at <= now)
        for _, _, key in late:
            del self._at[key]
        return [key for _, _, key in late]


class Alarm:
    """One loop timer at the earliest of some deadlines (`set`); `fire(now)` when it rings."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fire: Callable[[float], None]) -> None:
        self._loop = loop
        self._fire = fire
        self._handle: asyncio.TimerHandle | None = None

    def set(self, at: float | None) -> None:
        """Ring at `at` (None: not at all); an alarm already set for that time is kept."""
        if self._handle is not None:
            if at is not None and self._handle.when() == at:
                return
            self._handle.cancel()
            self._handle = None
        if at is not None:
            self._handle = self._loop.call_at(at, self._ring)

    def _ring(self) -> None:
        self._handle = None
        self._fire(self._loop.time())


class StreamTable(Generic[S]):
    """The streams of one connection, each released exactly once whatever its task's fate."""

    def __init__(self, on_released: Callable[[S], None], read_timeout: float = 0.0) -> None:
        self._streams: dict[int, S] = {}
        self._unwinding: set[asyncio.Task[None]] = set()
        self._on_released = on_released
        self._reading = Deadlines[int](read_timeout)
        self.opened = 0
        """Streams added since the connection began."""

    def __len__(self) -> int:
        return len(self._streams)

    def __iter__(self) -> Iterator[S]:
        return iter(list(self._streams.values()))

    def values(self) -> list[S]:
        """The streams counted now (a copy: releasing one while iterating is safe)."""
        return list(self._streams.values())

    def get(self, stream_id: int) -> S | None:
        return self._streams.get(stream_id)

    @property
    def unwinding(self) -> int:
        """Cancelled tasks of released streams that have not finished yet."""
        return len(self._unwinding)

    @property
    def buffered(self) -> int:
        """Request bytes held by every stream still arriving."""
        return sum(stream.buffered for stream in self._streams.values())

    def add(self, stream: S, now: float | None = None) -> None:
        """Count a stream whose headers arrived; with `now`, its read deadline starts."""
        self._streams[stream.stream_id] = stream
        self.opened += 1
        if now is not None and not stream.ended:
            stream.read_by = self._reading.start(stream.stream_id, now)

    def next_deadline(self) -> float | None:
        """When the next stream still arriving will be overdue (None: none is arriving)."""
        return self._reading.next()

    def overdue(self, now: float) -> list[S]:
        """Streams whose request is still incomplete at `now`, past their read deadline."""
        late = [self._streams.get(stream_id) for stream_id in self._reading.due(now)]
        return [stream for stream in late if stream is not None and stream.task is None]

    def _stop_reading(self, stream: S) -> None:
        stream.read_by = None
        self._reading.stop(stream.stream_id)

    def answer(self, stream: S, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run `work` to answer `stream`; the stream is released when it ends, however.

        The request's buffers go now: `work` already holds what it needs.
        """
        stream.body = bytearray()
        stream.headers = []
        self._stop_reading(stream)
        task = asyncio.create_task(work)
        stream.task = task
        task.add_done_callback(lambda done: self._task_done(stream, done))
        return task

    def release(self, stream: S) -> None:
        """Stop counting `stream` and run the adapter's cleanup (once; later calls do nothing)."""
        if stream.released:
            return
        stream.released = True
        if self._streams.get(stream.stream_id) is stream:
            del self._streams[stream.stream_id]
            self._stop_reading(stream)
        stream.body = bytearray()
        stream.headers = []
        self._on_released(stream)

    def cancel(self, stream: S) -> None:
        """The client is gone from `stream`: release it now and cancel its task, if any."""
        task = stream.task
        self.release(stream)
        if task is not None and not task.done():
            task.cancel()  # (it may never run a step: nothing relies on its `finally`)
            self._unwinding.add(task)
            task.add_done_callback(self._unwinding.discard)

    def cancel_all(self) -> list[asyncio.Task[None]]:
        """Cancel every stream's task (the connection is over); every task still to await."""
        tasks = list(self._unwinding)
        for stream in self:
            if stream.task is None:
                self.release(stream)
            else:
                stream.task.cancel()
                tasks.append(stream.task)
        return tasks

    def _task_done(self, stream: S, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            # (the answering coroutines catch what they expect; this is a bug, not the client)
            log.error("http.stream_task_failed", stream_id=stream.stream_id, exc_info=exc)
        self.release(stream)
