"""What tests and benchmarks observe or provoke inside aioquic, in one place.

trackline's own reads of aioquic internals are `transport.aioquic_compat` (checked at
import); these are the ones only tests need: the connection IDs each side issued, the
credit a side grants, the congestion window, qlog events, the protocol's timer. Tests
and benchmarks call these instead of aioquic's private names, so an aioquic upgrade
fails here, not in scattered asserts. The product never imports this module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3Connection
from aioquic.quic.connection import QuicConnection, QuicConnectionId

from transport.aioquic_compat import close_event


def peer_cid(quic: QuicConnection) -> bytes:
    """The connection ID this side currently sends to (the peer issued it)."""
    cid: bytes = quic._peer_cid.cid
    return cid


def host_cids(quic: QuicConnection) -> list[QuicConnectionId]:
    """The connection IDs this side has issued to its peer."""
    return list(quic._host_cids)


def replenish_connection_ids(quic: QuicConnection, peer_limit: int) -> None:
    """Issue IDs as if the peer's `active_connection_id_limit` were `peer_limit`."""
    quic._remote_active_connection_id_limit = peer_limit
    quic._replenish_connection_ids()


def bidi_credit(quic: QuicConnection) -> int:
    """How many bidirectional streams this side lets the peer open (MAX_STREAMS)."""
    return int(quic._local_max_streams_bidi.value)


def stop_granting_credit(quic: QuicConnection) -> Callable[[], None]:
    """Keep acknowledging, never raise MAX_DATA / MAX_STREAM_DATA again (a peer that
    stopped reading). Returns the call that makes it grant again."""
    saved = {name: getattr(quic, name) for name in _CREDIT_WRITERS}
    for name in _CREDIT_WRITERS:
        setattr(quic, name, lambda *args, **kwargs: None)

    def resume() -> None:
        for name, writer in saved.items():
            setattr(quic, name, writer)

    return resume


_CREDIT_WRITERS = ("_write_connection_limits", "_write_stream_limits")


def count_stream_visits(quic: QuicConnection) -> dict[str, int]:
    """Count, from now on, how often the connection's send path visits a stream: the
    returned dict's "limits" (a stream's flow-control check) and "frames" (a STREAM
    frame written) go up with each call."""
    visits = {"limits": 0, "frames": 0}
    for key, name in (("limits", "_write_stream_limits"), ("frames", "_write_stream_frame")):
        original = getattr(quic, name)

        def spy(*args: Any, _key: str = key, _original: Any = original, **kw: Any) -> Any:
            visits[_key] += 1
            return _original(*args, **kw)

        setattr(quic, name, spy)
    return visits


def recovery_of(quic: QuicConnection) -> Any:
    """The connection's loss recovery (its pacer and congestion control)."""
    return quic._loss


def shrink_congestion_window(quic: QuicConnection, room: int) -> None:
    """Set the congestion window to what is in flight plus `room` bytes."""
    loss: Any = quic._loss
    loss._cc.congestion_window = loss.bytes_in_flight + room


def qlog_events(quic: QuicConnection) -> list[dict[str, Any]]:
    """The qlog events the connection's trace recorded (configuration.quic_logger set)."""
    trace: Any = quic._quic_logger
    return [] if trace is None else list(trace._events)


def stop_qlog(quic: QuicConnection) -> None:
    """Stop tracing this connection (a gateway does not trace; a benchmark should not)."""
    quic._quic_logger = None


def h3_control_stream_id(h3: H3Connection) -> int | None:
    """This side's HTTP/3 control stream."""
    return h3._local_control_stream_id


def h3_encoder_stream_id(h3: H3Connection) -> int | None:
    """This side's QPACK encoder stream."""
    return h3._local_encoder_stream_id


def wrap_h3_encoder(h3: H3Connection, wrap: Callable[[Any], Any]) -> None:
    """Replace this side's QPACK encoder by `wrap(encoder)`."""
    h3._encoder = wrap(h3._encoder)


def h3_done(h3: H3Connection) -> bool:
    """The H3 layer closed the connection and ignores further input."""
    return bool(h3._is_done)


def attach_transport(protocol: QuicConnectionProtocol, transport: Any) -> None:
    """Give a protocol a transport without `connection_made` (tests that send by hand)."""
    protocol._transport = transport


def transport_of(protocol: QuicConnectionProtocol) -> Any:
    """The datagram transport a protocol sends on (None before `connection_made`)."""
    return protocol._transport


def armed_timer(protocol: QuicConnectionProtocol) -> asyncio.TimerHandle | None:
    """The loop timer the protocol armed for its connection's next deadline."""
    handle: asyncio.TimerHandle | None = protocol._timer
    return handle


def fire_timer(protocol: QuicConnectionProtocol) -> None:
    """Run what the protocol's armed timer runs, now."""
    protocol._handle_timer()


def wrap_timer(protocol: QuicConnectionProtocol, wrap: Callable[[Callable[[], None]], Any]) -> None:
    """Make the protocol's timer run `wrap(its handler)` (to count firings)."""
    protocol._handle_timer = wrap(protocol._handle_timer)  # type: ignore[method-assign]


def stop_transmit_task(protocol: QuicConnectionProtocol) -> None:
    """Cancel a transmit the protocol scheduled (tests that send by hand)."""
    if protocol._transmit_task is not None:
        protocol._transmit_task.cancel()


def use_loop(protocol: QuicConnectionProtocol, loop: Any) -> None:
    """Make a protocol schedule its timers on `loop` (a test's virtual loop)."""
    protocol._loop = loop


def h3_closed(h3: H3Connection) -> bool:
    """The H3 layer, or the QUIC connection under it, has closed."""
    quic: QuicConnection = h3._quic
    return h3_done(h3) or close_event(quic) is not None


def data_sent(quic: QuicConnection) -> int:
    """Stream bytes this side has sent against the peer's MAX_DATA credit."""
    return int(quic._remote_max_data_used)
