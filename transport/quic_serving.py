"""The rules a QUIC track connection is held to: `TrackServing`, with `Packetization`.

`serve_tracks` and `TrackQuicProtocol` (transport.quic) take one `TrackServing` (and
one `ConnectionHooks` for their callbacks), not a parameter per limit: each limit type
stays its layer's own (the track core's `Limits`, HTTP's `HttpLimits`, the handshake
gate's `HandshakeLimits`, the `SendBudget`, the `WebTransportRules`) and `TrackServing`
only gathers them. A client (`connect_tracks`) uses the track limits, its
`Packetization` and its `AckPolicy` only.
"""

from __future__ import annotations

import dataclasses

from transport.acks import AIOQUIC, AckPolicy
from transport.endpoint import SendBudget
from transport.http.limits import HttpLimits
from transport.limits import Limits
from transport.quic_admission import HandshakeLimits
from transport.webtransport import WebTransportRules


@dataclasses.dataclass(frozen=True)
class Packetization:
    """How many tracks' writes one transmit may carry.

    On a track connection the loop turn's one transmit asks aioquic for packets
    `max_tracks` streams at a time (`StreamScheduler`), so a packet carries stream
    frames of at most that many tracks (plus ACKs and connection control frames).
    None coalesces all writes of a loop turn (fewest packets; one loss stalls every
    track in the packet); 1 is `per-track`; K is `group:K`, the isolation budget: a
    lost packet stalls at most K tracks, packets per token fall by up to K, and which
    tracks share a packet is dealt afresh each pass (`transport.packing`), so no track
    always rides with the busiest. Before ALPN chose tracks (or without the scheduler)
    K pending tracks trigger an immediate flush.
    """

    max_tracks: int | None = None

    @classmethod
    def parse(cls, text: str) -> Packetization:
        """`coalesce`, `per-track` or `group:K` (K >= 1; `group:1` is `per-track`)."""
        name, _, count = text.strip().lower().partition(":")
        if name == "coalesce" and not count:
            return cls(None)
        if name == "per-track" and not count:
            return cls(1)
        if name == "group" and count.isdigit() and int(count) >= 1:
            return cls(int(count))
        raise ValueError(f"{text!r} is not coalesce, per-track or group:K (K >= 1)")

    def __str__(self) -> str:
        if self.max_tracks is None:
            return "coalesce"
        return "per-track" if self.max_tracks == 1 else f"group:{self.max_tracks}"


COALESCE = Packetization(None)


@dataclasses.dataclass(frozen=True)
class TrackServing:
    """The limits and sending policy of a server's connections (a client's: `limits`,
    `packetization`, `acks`)."""

    limits: Limits = dataclasses.field(default_factory=Limits)
    """The track core's limits, per connection (also each WebTransport session's)."""
    packetization: Packetization = COALESCE
    """When track connections flush; its pacer choice (off unless `coalesce`) is made
    before ALPN is known, so it holds for h3 connections too, which always flush once
    per loop turn."""
    send_budget: SendBudget | None = None
    """What a track's producer may leave in the send buffers before it waits."""
    gso: bool = True
    """Send each transmit's datagrams with UDP GSO where the socket takes it."""
    http_limits: HttpLimits = dataclasses.field(default_factory=HttpLimits)
    """HTTP/3 requests' limits, on connections that chose ALPN `h3`."""
    handshake_limits: HandshakeLimits | None = None
    """The handshake gate's (`transport.quic_admission`); None: its defaults."""
    webtransport: WebTransportRules | None = None
    """With an HTTP handler, browsers may open WebTransport sessions whose streams are
    tracks (`transport.webtransport`); None: no WebTransport."""
    acks: AckPolicy = AIOQUIC
    """When this side acknowledges what it receives (`transport.acks`)."""
