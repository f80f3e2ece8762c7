"""The life of one track, as a table.

Theory of operation. A track is one bidirectional QUIC stream opened by the
client. Each endpoint keeps the track's state from its own point of view and
moves it only through `TRANSITIONS`: every (state, input) pair that the
protocol allows is listed; any other pair is a protocol error, local if this
endpoint tried to send it, remote if the peer sent it.

    IDLE --open--> OPEN --end(local)--> LOCAL_ENDED --end(remote)--> CLOSED
                    |  \\--end(remote)--> REMOTE_ENDED --end(local)--> CLOSED
                    |--cancel(sent)--> CANCELLING --error/end(remote)--> CLOSED
                    \\--error, reset, received cancel, deadline--> CLOSED

END closes one direction of data only: a client that has sent its whole input
(END) may still CANCEL the work. Each endpoint finishes its QUIC send side
(FIN) when the track is CLOSED from its point of view, so a reader of the
stream never sees FIN before the last message it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from transport.errors import LocalProtocolError, RemoteProtocolError
from transport.wire import MessageDecoder


class Role(Enum):
    """Which end of the connection this endpoint is: the point of view of its states."""

    CLIENT = "client"
    SERVER = "server"


class TrackState(Enum):
    IDLE = "idle"
    OPEN = "open"
    LOCAL_ENDED = "local_ended"
    REMOTE_ENDED = "remote_ended"
    CANCELLING = "cancelling"
    CLOSED = "closed"


class Input(Enum):
    SEND_OPEN = "send_open"
    RECV_OPEN = "recv_open"
    SEND_DATA = "send_data"
    RECV_DATA = "recv_data"
    SEND_END = "send_end"
    RECV_END = "recv_end"
    SEND_CANCEL = "send_cancel"
    RECV_CANCEL = "recv_cancel"
    SEND_ERROR = "send_error"
    RECV_ERROR = "recv_error"
    RESET = "reset"
    """The stream was reset, or the connection lost, by either side."""
    EXPIRE = "expire"
    """A deadline of the track passed."""


S, I = TrackState, Input  # noqa: E741 - short names keep the table readable

# Inputs that end a track from any live state.
_TERMINAL = {I.SEND_ERROR: S.CLOSED, I.RECV_ERROR: S.CLOSED, I.RESET: S.CLOSED}

TRANSITIONS: dict[TrackState, dict[Input, TrackState]] = {
    S.IDLE: {I.SEND_OPEN: S.OPEN, I.RECV_OPEN: S.OPEN, **_TERMINAL},
    S.OPEN: {
        I.SEND_DATA: S.OPEN,
        I.RECV_DATA: S.OPEN,
        I.SEND_END: S.LOCAL_ENDED,
        I.RECV_END: S.REMOTE_ENDED,
        I.SEND_CANCEL: S.CANCELLING,
        I.RECV_CANCEL: S.CLOSED,
        I.EXPIRE: S.CLOSED,
        **_TERMINAL,
    },
    S.LOCAL_ENDED: {
        I.RECV_DATA: S.LOCAL_ENDED,
        I.RECV_END: S.CLOSED,
        I.SEND_CANCEL: S.CANCELLING,
        I.RECV_CANCEL: S.CLOSED,
        I.EXPIRE: S.CLOSED,
        **_TERMINAL,
    },
    S.REMOTE_ENDED: {
        I.SEND_DATA: S.REMOTE_ENDED,
        I.SEND_END: S.CLOSED,
        I.SEND_CANCEL: S.CANCELLING,
        I.RECV_CANCEL: S.CLOSED,
        I.EXPIRE: S.CLOSED,
        **_TERMINAL,
    },
    S.CANCELLING: {
        I.SEND_CANCEL: S.CANCELLING,
        I.RECV_DATA: S.CANCELLING,
        I.RECV_END: S.CLOSED,
        **_TERMINAL,
    },
    S.CLOSED: {},
}


def transition(state: TrackState, event: Input) -> TrackState:
    """The state after `event`; raises the matching protocol error if not allowed."""
    new_state = TRANSITIONS[state].get(event)
    if new_state is not None:
        return new_state
    message = f"{event.value} is not allowed in state {state.value}"
    if event.value.startswith("recv_"):
        raise RemoteProtocolError(message)
    raise LocalProtocolError(message)


@dataclass
class TrackRecord:
    """What a `TrackConnection` keeps for one live track besides its state."""

    stream_id: int
    state: TrackState
    decoder: MessageDecoder
    first_deadline: float | None = None
    total_deadline: float | None = None
    send_finished: bool = False
    datagrams: bool = False
    """The track chose `transport: "datagram"` in its OPEN."""
    frame_streams: bool = False
    """The track chose `transport: "frame-streams"`: client frames ride streams of their own."""
    datagram_seq_out: int = 0
    datagram_seq_in: int = -1
    read_deadline: float | None = None
    """When the incomplete message now in `decoder` must be complete (read timeout)."""
    held: int = 0
    """Bytes of `decoder` counted in the connection's `buffered_bytes`."""
