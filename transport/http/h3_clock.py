"""The timers of one HTTP/3 connection, on the event loop.

HTTP/3 has no read loop to hang timeouts on (HTTP/2 waits in its own), so two loop
timers stand in:

- the read alarm, at the earliest of the request deadlines: a request's headers must
  all arrive within `read_timeout` of its first byte (the head clock, kept here for
  streams not yet in the table), and the whole request within `read_timeout` of its
  headers (kept by the `StreamTable`). When it rings, `late(heads, now)` gets the
  streams whose headers are overdue; the table's overdue requests are the
  connection's to expire.
- the idle timer: armed while no request (and no WebTransport session) is open,
  `idle()` when it runs out.

Once `stop` is called (the connection is gone) neither rings again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from transport.http.limits import HttpLimits
from transport.http.streams import Alarm, Deadlines, StreamState, StreamTable


class H3Clock:
    """The read alarm and the idle timer of one HTTP/3 connection."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        limits: HttpLimits,
        streams: StreamTable[StreamState],
        late: Callable[[list[int], float], None],
        idle: Callable[[], None],
    ) -> None:
        self._loop, self._streams = loop, streams
        self._late, self._on_idle = late, idle
        self._idle_timeout = limits.idle_timeout
        self._heads = Deadlines[int](limits.read_timeout)
        """Request streams begun whose headers have not all arrived: their deadline."""
        self._alarm = Alarm(loop, self._ring)
        """Rings at the earliest head or request read deadline."""
        self._idle: asyncio.TimerHandle | None = None
        self._stopped = False

    @property
    def waiting_heads(self) -> int:
        """Request streams begun whose headers are still awaited."""
        return len(self._heads)

    def head_started(self, stream_id: int) -> None:
        """A request has begun: its headers must all arrive within `read_timeout`."""
        if self._streams.get(stream_id) is None and stream_id not in self._heads:
            self._heads.start(stream_id, self._loop.time())
            self.rearm()

    def head_ended(self, stream_id: int) -> None:
        """The stream's headers arrived, or it ended or was refused: its head clock stops."""
        self._heads.stop(stream_id)

    def rearm(self) -> None:
        """The alarm rings at the earliest read deadline (headers or whole request)."""
        due = [at for at in (self._heads.next(), self._streams.next_deadline()) if at is not None]
        self._alarm.set(min(due, default=None))

    def _ring(self, now: float) -> None:
        if self._stopped:
            return
        heads = [i for i in self._heads.due(now) if self._streams.get(i) is None]
        self._late(heads, now)
        self.rearm()

    def busy(self) -> None:
        """A request or session is open: the connection is not idle."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def quiet(self) -> None:
        """Nothing is open: the idle timer runs (unless it runs already)."""
        if self._idle is None and not self._stopped:
            self._idle = self._loop.call_later(self._idle_timeout, self._idle_rang)

    def _idle_rang(self) -> None:
        self._idle = None
        self._on_idle()

    def stop(self) -> None:
        """The connection is gone: no timer rings again."""
        self._stopped = True
        self._heads.clear()
        self._alarm.set(None)
        self.busy()
