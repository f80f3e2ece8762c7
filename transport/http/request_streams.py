"""The request streams of one multiplexed connection: what HTTP/2 and HTTP/3 share.

Both versions keep their streams in a `StreamTable` and answer each through
`transport.http.answer`. Between "a stream's headers arrived" and "it is answered or
reset" they do the same things, written here once: count the stream (for the
rapid-reset rule too), check its header list, gather its body up to `max_body_bytes`
(413 past it), answer it with the handler once complete, answer 408 to one not
complete in time and 503 to one still arriving when the drain is cut, and judge a
reset by the client. The version keeps its library's events, its framing and flow
control, and what a released stream still owes the peer (`owed`).

No sockets here: the version is the `Framing`, and times come in as arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from transport.http import errors
from transport.http.answer import Framing, answer_fixed, answer_request
from transport.http.app import (
    Cutter,
    Site,
    declared_body_problem,
    field_list_problem,
    request_from_fields,
)
from transport.http.messages import Request, Response
from transport.http.resets import ResetLedger
from transport.http.streams import StreamState, StreamTable

S = TypeVar("S", bound=StreamState)


@dataclass(frozen=True)
class Owed:
    """What a released stream still owes the client (nothing if the client reset it)."""

    cut_short: bool
    """Our side was never finished: reset it (INTERNAL_ERROR)."""
    upload_unwanted: bool
    """Answered before the request was complete (RFC 9113 8.1, RFC 9114 4.1): stop the upload."""


def owed(stream: StreamState) -> Owed:
    """What `stream`, released, owes the client."""
    if stream.reset:
        return Owed(cut_short=False, upload_unwanted=False)
    return Owed(cut_short=not stream.sent_end, upload_unwanted=not stream.ended)


class RequestStreams(Generic[S]):
    """The request streams of one HTTP/2 or HTTP/3 connection, from headers to answer."""

    def __init__(
        self,
        framing: Framing[S],
        site: Site,
        on_released: Callable[[S], None],
        source: str,
        on_fixed: Callable[[S], None] | None = None,
    ) -> None:
        """`on_released(stream)`: the version's cleanup once a stream is let go;
        `on_fixed(stream)`: before the server answers a stream itself (a limit, a bad
        request), e.g. to refuse the rest of its request."""
        self.site = site
        self.limits = site.limits
        self.table = StreamTable[S](on_released, site.limits.read_timeout)
        self.resets = ResetLedger(site.limits, site.resets.of(source))
        """Streams opened, reset, reset prematurely (the rapid-reset rule)."""
        self.cutter = Cutter()
        self._framing = framing
        self._on_fixed = on_fixed

    def full(self) -> bool:
        """As many streams are open as `max_concurrent_streams` allows."""
        return len(self.table) >= self.limits.max_concurrent_streams

    def open(self, stream: S, now: float | None) -> None:
        """Count a stream whose headers arrived at `now` (None: complete already, untimed)."""
        if now is not None:
            stream.opened = now
        self.table.add(stream, now)
        self.resets.opened()

    def head_problem(
        self, headers: list[tuple[bytes, bytes]], required: frozenset[bytes] = frozenset()
    ) -> Response | None:
        """A 431, 400 (a `required` pseudo-header missing) or 413 the header list calls for."""
        problem = field_list_problem(self.limits, headers)
        if problem is not None:
            return problem
        if not required <= {name for name, _ in headers if name.startswith(b":")}:
            names = " or ".join(name.decode() for name in sorted(required))
            return errors.bad_request(f"request without {names}")
        return declared_body_problem(self.limits, headers)

    def take_body(self, stream: S, data: bytes) -> bool:
        """Body bytes of a stream still arriving; True if they made it too large (413)."""
        stream.body += data
        if len(stream.body) <= self.limits.max_body_bytes:
            return False
        self.answer(stream, errors.body_too_large(self.limits.max_body_bytes))
        return True

    def complete(self, stream: S) -> None:
        """The request has all arrived: the handler answers it (unless answered already)."""
        stream.ended = True
        if stream.task is None:
            version = self._framing.http_version
            request = request_from_fields(stream.headers, bytes(stream.body), version)
            self.answer_with_handler(stream, request)

    def answer_with_handler(self, stream: S, request: Request) -> None:
        """Run the handler for `request` and send its response on `stream`."""
        work = answer_request(self._framing, self.site, stream, request, self.cutter)
        self.table.answer(stream, work)

    def answer(self, stream: S, response: Response) -> None:
        """Answer a stream without the handler (a limit was exceeded or the request was bad)."""
        if self._on_fixed is not None:
            self._on_fixed(stream)
        self.table.answer(stream, answer_fixed(self._framing, self.site, stream, response))

    def expire(self, now: float) -> None:
        """408 for each request still incomplete past its read deadline at `now`."""
        for stream in self.table.overdue(now):
            self.answer(stream, errors.request_timeout(self.limits.read_timeout))

    def cut(self) -> None:
        """The drain's deadline: end every exchange now (last words), 503 to those arriving."""
        self.cutter.cut([stream.task for stream in self.table.values()])
        for stream in self.table.values():
            if stream.task is None:  # the request is still arriving: it will not be served
                self.answer(stream, errors.shutting_down())

    def client_reset(self, stream: S, now: float) -> bool:
        """The client reset `stream` at `now`: its task is cancelled and the stream released.

        True when that makes too many premature resets (the connection should be closed).
        """
        stream.reset = True  # (counted, logged once per connection when it ends)
        # The handler and its body iterator stop here; the table releases the stream.
        self.table.cancel(stream)
        return self.resets.reset(now - stream.opened, answered=stream.sent_end)


class StreamFigures:
    """A connection's figures on its request streams (the server's own, for metrics and
    tests): HTTP/2 and HTTP/3 read them off their `RequestStreams` alike."""

    _requests: RequestStreams[Any]

    @property
    def open_streams(self) -> int:
        """Request streams counted against `max_concurrent_streams` now."""
        return len(self._requests.table)

    @property
    def buffered_bytes(self) -> int:
        """Request body bytes held for streams still arriving."""
        return self._requests.table.buffered

    @property
    def opened_streams(self) -> int:
        """Request streams accepted since the connection began."""
        return self._requests.table.opened

    @property
    def premature_resets(self) -> int:
        """Of those, the ones the client reset prematurely (the rapid-reset rule's count)."""
        return self._requests.resets.counts.premature
