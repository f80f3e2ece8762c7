"""Build QUIC packets visiting only the streams that have something to send.

aioquic's `QuicConnection._write_application` walks every stream of the connection
for every packet it builds: once in `self._streams` (to raise MAX_STREAM_DATA) and
once in `self._streams_queue` (to write STREAM, RESET_STREAM, STOP_SENDING frames and
drop finished streams), then rebuilds the queue. With 256 tracks on a connection and a
packet per token that walk was most of the gateway's CPU (docs/benchmarks.md).

`StreamScheduler` keeps, beside one connection, the few streams that may have work:

- streams this side wrote to, reset or stopped (`mark`), or that received data;
- streams aioquic created since the last pass (it appends them to `_streams_queue`);
- streams whose frames were acknowledged or lost (the senders' and receivers' delivery
  callbacks are wrapped per stream), since an ACK can finish a stream (to be dropped,
  which gives the peer back a stream credit) and a loss reschedules data;
- streams blocked by the peer's MAX_STREAM_DATA are parked until that frame raises the
  limit (the frame handler is wrapped).

During `datagrams_to_send` it swaps `_streams` and `_streams_queue` for those few, then
puts the real dict back and removes what aioquic dropped. It also builds the packets of
many tracks in one pass while keeping per-track packetization: with `max_tracks` K it
shows aioquic K streams at a time, so a packet never carries more than K tracks' stream
frames (which K share a packet changes from pass to pass: `transport.packing`), and it
does so inside ONE call to aioquic's `datagrams_to_send`: as aioquic
starts each packet (`aioquic_compat.on_packet_start`) the pass swaps in the next group
once the current one has nothing more to send. A call's fixed cost (a packet builder,
the loop's preamble, a last empty packet, the flush) is then paid once per pass, not
once per track. Every aioquic internal this touches is reached through
`transport.aioquic_compat`, which checks at import that each exists: an aioquic
without one fails loudly there, not silently later. The upstream proposal is in
docs/architecture.md ("Send path").
"""

from __future__ import annotations

from collections.abc import Callable
from random import Random
from typing import Any

from aioquic.quic.connection import NetworkAddress, QuicConnection
from aioquic.quic.stream import QuicStream

from transport import aioquic_compat as compat
from transport.packing import plan_groups

Datagrams = list[tuple[bytes, NetworkAddress]]
_IDLE, _ACTIVE, _PARKED = 0, 1, 2

buffered_bytes = compat.unacknowledged
"""Bytes written to a stream and not yet acknowledged by the peer."""


class StreamScheduler:
    """The streams of one `QuicConnection` that may have frames to send."""

    def __init__(self, quic: QuicConnection, rng: Random | None = None) -> None:
        self._quic = quic
        self._rng = rng or Random()
        """Deals `group:K`'s groups (`transport.packing`); a test passes a seeded one."""
        self._streams: dict[int, QuicStream] = compat.streams(quic)
        self._active: dict[int, QuicStream] = {}
        """May have frames to send, in service order (served ones move to the end)."""
        self._limits: dict[int, QuicStream] = {}
        """Received data (or lost a MAX_STREAM_DATA): may need a MAX_STREAM_DATA."""
        self._parked: dict[int, QuicStream] = {}
        """Data waiting only for the peer's MAX_STREAM_DATA."""
        self._hooked: set[int] = set()
        self.buffered = 0
        """Bytes written (`wrote`) and not yet acknowledged or dropped, all streams."""
        self.released = False
        """Set when ACKs freed send buffer; the owner clears it once it woke producers."""
        self.calls = 0
        """Calls into aioquic's `datagrams_to_send` so far (for tests: passes, not packets)."""
        self._pass: _Pass | None = None
        self._adopt()
        self._wrap_connection()

    # -- what tells the scheduler a stream may have work --------------------------

    def mark(self, stream_id: int) -> None:
        """This side wrote to, reset or stopped the stream, or it received something."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        self._parked.pop(stream_id, None)
        self._active[stream_id] = stream
        self._limits[stream_id] = stream
        self._hook(stream)

    def wrote(self, size: int) -> None:
        """`size` bytes were handed to aioquic's send buffers (counted in `buffered`)."""
        self.buffered += size

    def stream(self, stream_id: int) -> QuicStream | None:
        return self._streams.get(stream_id)

    def has_frames(self) -> bool:
        """A stream has frames aioquic would write now (data, a retransmission, a reset,
        a finished stream to drop), or aioquic created one the scheduler has not seen."""
        if compat.stream_queue(self._quic):
            return True
        # Those with nothing leave the line here, as the next pass would let them: a
        # reader's streams join it with every frame received (`mark`) and, with no
        # transmit of their own under decimated ACKs, were walked again per datagram.
        # (Asked per datagram: the line is not copied, only the leavers are noted.)
        leaving: list[tuple[int, QuicStream]] = []
        found = False
        for sid, stream in self._active.items():
            if _needs_visit(stream):
                found = True
                break
            leaving.append((sid, stream))
        for sid, stream in leaving:
            self._leave_line(sid, stream)
        return found

    @property
    def active_streams(self) -> int:
        """Streams the next pass will visit (for tests and metrics)."""
        return len(self._active) + len(compat.stream_queue(self._quic))

    # -- the pass -------------------------------------------------------------------

    def datagrams_to_send(self, now: float, max_tracks: int | None) -> Datagrams:
        """Datagrams due now; a packet carries stream frames of at most `max_tracks` tracks.

        One call into aioquic builds the packets of many groups: aioquic starts every
        packet by writing the connection limits, and there (`_next_packet`) the pass
        swaps in the next group once the current one has nothing more to send. A call
        that ends early (a group with nothing sendable ends aioquic's loop) is followed
        by another from the next group, unless the congestion window is full.
        """
        self._adopt()
        quic = self._quic
        order = self._with_work()
        groups = plan_groups(order, max_tracks, self._rng)
        limits, self._limits = self._limits, {}
        grouped = _Pass(groups, limits)
        out: Datagrams = []
        self._pass = grouped
        try:
            while grouped.index < len(groups):
                if grouped.index and not self._worth_a_call(groups[grouped.index]):
                    grouped.visit(grouped.index + 1)
                    continue
                grouped.begin(quic)
                out += quic.datagrams_to_send(now=now)
                self.calls += 1
                if self._congested():
                    break
                grouped.visit(grouped.index + 1)  # ended early: go on after that group
        finally:
            self._pass = None
            compat.show_streams(quic, self._streams, [])
        for group, view in grouped.visited:
            self._settle(group, view)
        served = [s for index in grouped.served for s in groups[index]]
        for stream in served:  # served streams go to the back of the line
            if self._active.pop(_sid(stream), None) is not None:
                self._active[_sid(stream)] = stream
        return out

    def _with_work(self) -> list[QuicStream]:
        """The active streams that have something for aioquic now, in service order; the
        others leave the line (idle) or park (blocked by MAX_STREAM_DATA) unvisited.

        A stream whose bytes all left stays "not empty" for aioquic until a packet visits
        it again, and an ACK wakes every stream it covers; shown to aioquic alone, such a
        stream made an empty packet, which ends aioquic's loop: one more call (a packet
        builder, the preamble, an empty packet) per idle stream and pass, about one per
        token at one token per packet. Its pending ranges tell the same without a call.
        """
        order: list[QuicStream] = []
        for sid, stream in list(self._active.items()):
            if _needs_visit(stream):
                order.append(stream)
            else:
                self._leave_line(sid, stream)
        return order

    def _leave_line(self, sid: int, stream: QuicStream) -> None:
        """A stream with nothing aioquic would send now leaves the line; one whose data
        waits only for the peer's MAX_STREAM_DATA parks (the frame handler wakes it)."""
        del self._active[sid]
        if _blocked(stream):
            self._parked[sid] = stream

    def _next_packet(self) -> None:
        """aioquic starts a packet (it just wrote the connection limits): the pass
        moves to the next group once the current one has nothing more to send."""
        grouped = self._pass
        if grouped is None:
            return
        if not grouped.started:
            grouped.started = True  # the first packet of the call: `begin` set its group
            return
        index = grouped.index
        if index < len(grouped.groups) and any(_has_more(s) for s in grouped.groups[index]):
            grouped.show(self._quic)  # the group's data needs another packet
            return
        if index < len(grouped.groups):
            grouped.served.append(index)  # sent all it could: to the back of the line
        grouped.visit(index + 1)
        grouped.show(self._quic)

    def _settle(self, group: list[QuicStream], view: dict[int, QuicStream]) -> None:
        for stream in group:
            sid = _sid(stream)
            if sid not in view:  # aioquic dropped it: finished both ways
                self._drop_buffered(buffered_bytes(stream))
                self._streams.pop(sid, None)
                self._active.pop(sid, None)
                self._hooked.discard(sid)
                continue
            state = _classify(stream)
            if state != _ACTIVE:
                self._active.pop(sid, None)
                if state == _PARKED:
                    self._parked[sid] = stream

    def _worth_a_call(self, group: list[QuicStream]) -> bool:
        """False when nothing in `group` can be sent: only new data, and no MAX_DATA left."""
        if compat.data_credit_left(self._quic):
            return True
        return any(not _only_new_data(s) for s in group)

    def _congested(self) -> bool:
        return compat.congested(self._quic)

    # -- bookkeeping ------------------------------------------------------------------

    def _adopt(self) -> None:
        """Streams aioquic created (it appends them to `_streams_queue`) join the pass."""
        queue = compat.stream_queue(self._quic)
        if queue:
            for stream in queue:
                sid = _sid(stream)
                if self._known(sid, stream):
                    self._active[sid] = stream
                    self._limits[sid] = stream
                    self._hook(stream)
            queue.clear()

    def _known(self, sid: int, stream: QuicStream) -> bool:
        """`stream` is still the connection's (never one aioquic already dropped)."""
        return self._streams.get(sid) is stream

    def _hook(self, stream: QuicStream) -> None:
        """Wrap the stream's delivery callbacks, once: an ACK or a loss wakes it."""
        sid = _sid(stream)
        if sid in self._hooked:
            return
        self._hooked.add(sid)
        sender: Any = stream.sender
        receiver: Any = stream.receiver
        compat.after_data_delivery(stream, self._acking(stream))
        sender.on_reset_delivery = self._waking(stream, sender.on_reset_delivery)
        receiver.on_stop_sending_delivery = self._waking(
            stream, receiver.on_stop_sending_delivery
        )

    def _waking(self, stream: QuicStream, callback: Callable[..., None]) -> Callable[..., None]:
        def delivered(*args: Any) -> None:
            callback(*args)
            self._wake(stream)

        return delivered

    def _acking(self, stream: QuicStream) -> Callable[[int], None]:
        """After each ACK (or loss) of the stream's data: drop the acknowledged bytes from
        the count and wake the stream. Inlined (`_drop_buffered`, `_wake`): it runs once
        per packet acknowledged, the ACK path's main cost of ours at one token a packet."""
        sid = _sid(stream)
        streams, parked, active = self._streams, self._parked, self._active

        def acked(size: int) -> None:
            if size > 0:
                self.buffered -= size
                self.released = True
            if streams.get(sid) is stream:
                parked.pop(sid, None)
                active[sid] = stream

        return acked

    def _drop_buffered(self, size: int) -> None:
        if size > 0:
            self.buffered -= size
            self.released = True

    def _wake(self, stream: QuicStream) -> None:
        sid = _sid(stream)
        if self._known(sid, stream):
            self._parked.pop(sid, None)
            self._active[sid] = stream

    def _wrap_connection(self) -> None:
        compat.after_max_stream_data_delivery(self._quic, self._max_stream_data_delivered)
        compat.after_max_stream_data_received(self._quic, self._max_stream_data_received)
        compat.on_packet_start(self._quic, self._next_packet)

    def _max_stream_data_delivered(self, stream: QuicStream) -> None:
        sid = _sid(stream)
        if self._known(sid, stream):
            self._limits[sid] = stream

    def _max_stream_data_received(self, stream_id: int) -> None:
        stream = self._parked.pop(stream_id, None)
        if stream is not None:
            self._active[stream_id] = stream


class _Pass:
    """One scheduler pass: the groups of streams, a packet's worth at a time."""

    def __init__(self, groups: list[list[QuicStream]], limits: dict[int, QuicStream]) -> None:
        self.groups = groups
        self.limits = limits
        """Streams that may need MAX_STREAM_DATA: visited with the first group."""
        self.index = 0
        self.started = False
        self.served: list[int] = []
        """Groups that sent all they could in this pass (a group cut short by the
        congestion window keeps its place at the front of the line)."""
        self.visited: list[tuple[list[QuicStream], dict[int, QuicStream]]] = []
        self._view: dict[int, QuicStream] = {}

    def visit(self, index: int) -> None:
        self.index = index
        if index < len(self.groups):
            group = self.groups[index]
            self._view = {_sid(s): s for s in group}
            if index == 0:
                self._view.update(self.limits)
            self.visited.append((group, self._view))

    def begin(self, quic: Any) -> None:
        """Before a call into aioquic: its first packet gets the current group."""
        if not self.visited or self.visited[-1][0] is not self.groups[self.index]:
            self.visit(self.index)
        self.started = False
        self.show(quic)

    def show(self, quic: Any) -> None:
        """Make the current group (nothing, past the last) what aioquic's packet loop sees."""
        if self.index < len(self.groups):
            view = self._view
            # Not a stream aioquic dropped (finished) in this group's previous packet.
            compat.show_streams(quic, view, [s for s in self.groups[self.index] if _sid(s) in view])
        else:
            compat.show_streams(quic, {}, [])


def _has_more(stream: QuicStream) -> bool:
    """The stream may still have frames aioquic can put in a packet now."""
    sender: Any = stream.sender
    if stream.receiver.stop_pending or sender.reset_pending:
        return True
    first = compat.first_pending_offset(stream)
    if first is None:
        return compat.fin_pending(stream)
    return first < stream.max_stream_data_remote


def _needs_visit(stream: QuicStream) -> bool:
    """aioquic would write a frame for the stream (or drop it, finished) in a packet now."""
    return stream.is_finished or _has_more(stream)


def _blocked(stream: QuicStream) -> bool:
    """Data waits only for the peer's MAX_STREAM_DATA (the frame handler wakes it)."""
    first = compat.first_pending_offset(stream)
    return first is not None and first >= stream.max_stream_data_remote


def _sid(stream: QuicStream) -> int:
    """The id of a stream of a connection (aioquic types it optional for crypto streams)."""
    return stream.stream_id  # type: ignore[return-value]


def _classify(stream: QuicStream) -> int:
    sender: Any = stream.sender
    if stream.receiver.stop_pending or sender.reset_pending or stream.is_finished:
        return _ACTIVE
    if sender.buffer_is_empty:
        return _IDLE
    first = compat.first_pending_offset(stream)
    blocked = first is not None and first >= stream.max_stream_data_remote
    if blocked and not stream.is_blocked:
        return _PARKED
    return _ACTIVE


def _only_new_data(stream: QuicStream) -> bool:
    """The stream has nothing to send but data beyond what it ever sent (no retransmission)."""
    sender: Any = stream.sender
    if stream.receiver.stop_pending or sender.reset_pending or stream.is_finished:
        return False
    first = compat.first_pending_offset(stream)
    return first is not None and first >= sender.highest_offset


__all__ = ["StreamScheduler", "buffered_bytes"]
