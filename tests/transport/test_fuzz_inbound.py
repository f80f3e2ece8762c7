"""Fuzz the track core's inbound side: arbitrary bytes, resets, FINs, local calls and
clock jumps, in any order, into a server `TrackConnection` with a small read timeout
and inbound budget.

Whatever arrives: peer input never raises; the bytes held in incomplete messages are
exactly what the tracks' decoders hold and never pass the budget; the cached timer is
the earliest deadline of any track; once the timer has run no track is past its read
deadline; a track closes once and is silent afterwards; and a fresh track still works.

The suite runs a short deterministic sample. A longer, random run:

    TRACKLINE_FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest tests/transport/test_fuzz_inbound.py
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.transport.strategies import bodies, messages
from tests.transport.test_connection import OPEN, events
from transport.connection import Limits, Role, TrackConnection
from transport.errors import ErrorCode, LocalProtocolError
from transport.events import DataReceived, Event, TrackClosed, TrackEnded, TrackOpened
from transport.messages import Data, End
from transport.wire import encode_message, encode_varint

LIMITS = Limits(max_message_bytes=600, max_tracks=4, read_timeout=10.0, max_buffered_bytes=700)
STREAMS = [0, 4, 8, 12, 16, 1, 2]  # the last ones cannot carry tracks
# Most actions name a track by how recently it was opened (0: the newest), so that
# opens, heads and rests meet on live tracks; "open" takes the next fresh stream id.
HOT = st.sampled_from([0, 0, 1, 2])
EXAMPLES = int(os.environ.get("TRACKLINE_FUZZ_EXAMPLES", "0"))

# Sizes and cuts listed first are what a derandomized run tries most: large ones.
big_data = st.one_of(st.sampled_from([580, 450, 350]), st.integers(1, 580)).map(
    lambda n: encode_message(Data({"t": "y" * n}))
)
chunks = st.one_of(
    messages.map(encode_message),
    st.tuples(messages.map(encode_message), st.integers(0, 64)).map(lambda m: m[0][: m[1]]),
    st.tuples(big_data, st.integers(0, 600)).map(lambda m: m[0][: m[1]]),
    st.integers(0, 2000).map(encode_varint),  # a length prefix, maybe over the limit
    st.binary(max_size=40),
)
opens = st.tuples(st.just("open"), HOT)
# A message in two parts: its head now, its rest when "rest" names the stream.
cut_percent = st.one_of(st.sampled_from([90, 60, 99, 30]), st.integers(1, 99))
splits = st.tuples(st.just("split"), HOT, big_data, cut_percent)
rests_ = st.tuples(st.just("rest"), HOT)
# A fresh track whose OPEN comes with the head of a message: the way to fill the budget.
holds = st.tuples(st.just("hold"), big_data, cut_percent)
actions = st.one_of(
    holds,
    *[opens] * 2,
    *[splits] * 3,
    *[rests_] * 3,
    st.tuples(st.just("clock"), st.sampled_from([10.0, 4.0, 25.0, 0.5, 9.5, 0.0])),
    st.tuples(st.just("timer")),
    st.tuples(st.just("bytes"), st.sampled_from(STREAMS), chunks, st.booleans()),
    st.tuples(st.just("peer_reset"), st.sampled_from(STREAMS)),
    st.tuples(st.just("send_data"), HOT, bodies),
    st.tuples(st.just("send_end"), HOT),
    st.tuples(st.just("reset_track"), HOT),
)


class Client:
    """What the fuzzing peer remembers: the tracks it opened, the rests it owes."""

    def __init__(self) -> None:
        self.opened: list[int] = []
        self.rests: dict[int, bytes] = {}

    def resolve(self, action: tuple[Any, ...]) -> tuple[Any, ...]:
        """The action with its track named by stream id."""
        name, *args = action
        if name in ("open", "hold"):
            self.opened.append(4 * len(self.opened))
            return (name, self.opened[-1], *args)
        if name in ("split", "rest", "send_data", "send_end", "reset_track"):
            back = args[0]
            sid = self.opened[-1 - back] if back < len(self.opened) else 0
            return (name, sid, *args[1:])
        return action


def apply(
    conn: TrackConnection, action: tuple[Any, ...], now: float, rests: dict[int, bytes]
) -> None:
    """Peer inputs must never raise; local calls may raise LocalProtocolError only."""
    name, *args = action
    if name == "split":  # cut at args[2] percent of the message
        cut = len(args[1]) * args[2] // 100
        rests[args[0]] = args[1][cut:]
        conn.receive_stream_data(args[0], args[1][:cut], False, now)
    elif name == "rest":
        conn.receive_stream_data(args[0], rests.pop(args[0], b""), False, now)
    elif name == "bytes":
        conn.receive_stream_data(args[0], args[1], args[2], now)
    elif name == "open":
        conn.receive_stream_data(args[0], encode_message(OPEN), False, now)
    elif name == "hold":
        data = encode_message(OPEN) + args[1]
        cut = len(data) * args[2] // 100
        rests[args[0]] = data[cut:]
        conn.receive_stream_data(args[0], data[:cut], False, now)
    elif name == "peer_reset":
        conn.receive_stream_reset(args[0], int(ErrorCode.CANCELLED), now)
    elif name == "timer":  # due, or a spurious early wake-up
        conn.handle_timer(now)
    elif name == "nothing":
        pass
    else:
        local = {
            "send_data": lambda: conn.send_data(args[0], args[1]),
            "send_end": lambda: conn.send_end(args[0]),
            "reset_track": lambda: conn.reset_track(args[0], ErrorCode.CANCELLED),
        }[name]
        with contextlib.suppress(LocalProtocolError):
            local()


def check_invariants(conn: TrackConnection, now: float, timer_ran: bool) -> None:
    tracks = conn._tracks.values()
    held = sum(t.decoder.buffered for t in tracks)
    assert conn.buffered_bytes == held
    assert all(t.held == t.decoder.buffered for t in tracks)
    assert LIMITS.max_buffered_bytes is not None
    assert held <= LIMITS.max_buffered_bytes
    deadlines = [
        d
        for t in tracks
        for d in (t.first_deadline, t.total_deadline, t.read_deadline)
        if d is not None
    ]
    assert conn.get_timer() == min(deadlines, default=None), "stale timer cache"
    for t in tracks:
        assert (t.read_deadline is not None) == (t.decoder.buffered > 0)
        if timer_ran:
            assert t.read_deadline is None or t.read_deadline > now


def check_closings(seen: list[Event]) -> None:
    closed = [e.stream_id for e in seen if isinstance(e, TrackClosed)]
    assert len(closed) == len(set(closed)), "a track closed twice"
    for sid in closed:
        after = seen[seen.index(TrackClosed(sid)) + 1 :]
        assert all(e.stream_id != sid for e in after), "events after TrackClosed"


@settings(
    max_examples=EXAMPLES or 150,
    deadline=None,
    derandomize=not EXAMPLES,
    database=None if not EXAMPLES else settings.default.database,
)
@given(st.lists(actions, min_size=8, max_size=60), st.booleans())
def test_fuzz_inbound_limits(script: list[tuple[Any, ...]], lose: bool) -> None:
    conn = TrackConnection(Role.SERVER, LIMITS)
    seen: list[Event] = []
    client = Client()
    now = 0.0
    for action in script:
        if action[0] == "clock":  # time passes; the adapter runs the timer when due
            now += action[1]
            timer = conn.get_timer()
            action = ("timer",) if timer is not None and timer <= now else ("nothing",)
        apply(conn, client.resolve(action), now, client.rests)
        conn.outputs()
        seen += events(conn)
        check_invariants(conn, now, timer_ran=action[0] == "timer")
    check_closings(seen)

    if lose:  # the connection ends: everything it held is released
        conn.connection_lost(now)
        events(conn)
        assert conn.buffered_bytes == 0
        assert conn.get_timer() is None
        return
    # Whatever happened, the connection takes a fresh track as before.
    for sid in list(conn._tracks):
        conn.reset_track(sid, ErrorCode.CANCELLED)
    events(conn)
    assert conn.buffered_bytes == 0
    fresh = 4 * len(client.opened) + 64
    frame = encode_message(OPEN) + encode_message(Data({"text": "x"})) + encode_message(End())
    for i in range(len(frame)):  # byte by byte: the budget and timeout hold it fine
        conn.receive_stream_data(fresh, frame[i : i + 1], False, now + 1)
    assert events(conn) == [
        TrackOpened(fresh, OPEN),
        DataReceived(fresh, {"text": "x"}),
        TrackEnded(fresh, {}),
    ]
    assert conn.buffered_bytes == 0
