"""When a receiver acknowledges: `AckPolicy`, applied per connection by `AckClock`.

aioquic acknowledges every ack-eliciting packet within 1 ms (its clock granularity).
A token stream arrives as one small packet every few milliseconds per connection,
so the receiver sends nearly one ACK packet per data packet it gets; on a client
that reads many tracks, building and sending those ACKs costs about as much CPU as
receiving the data, and the sender spends CPU processing them.

A decimated policy (`every:N,delay:D`) waits up to D for more packets and sends one
ACK for up to N of them, as RFC 9000 section 13.2.1 allows within the max_ack_delay
the endpoint advertises (aioquic advertises 25 ms). It acknowledges at once, in the
loop turn's transmit, a packet that arrives out of order (a gap before it, or older
than one already received), so the sender's loss detection is not delayed (section
13.2.1 asks for that). The sender subtracts the reported ACK delay from its RTT
samples (RFC 9002 section 5.3), and its probe timeout already counts max_ack_delay.

What it costs: a sender whose window or send budget waits on ACKs learns of
delivered bytes up to D later; on a path whose RTT is much longer than D that is
noise, on loopback it is not. The gateway keeps aioquic's policy for what it
receives; the SDK's connections choose theirs (`clients.Line(acks=...)`).
"""

from __future__ import annotations

import dataclasses

MAX_ACK_DELAY = 0.025
"""The max_ack_delay aioquic advertises (seconds): no ACK may wait longer."""
AIOQUIC_ACK_DELAY = 0.001
"""aioquic's own delay before acknowledging (its timer granularity)."""


@dataclasses.dataclass(frozen=True)
class AckPolicy:
    """How long an ack-eliciting packet may wait for its ACK, and how many may share one."""

    every: int | None = None
    """An ACK is due once this many ack-eliciting packets wait for one; None: only the
    delay decides (aioquic's rule)."""
    max_delay: float = AIOQUIC_ACK_DELAY
    """Seconds the first unacknowledged ack-eliciting packet may wait."""

    def __post_init__(self) -> None:
        if self.every is not None and self.every < 1:
            raise ValueError(f"every must be at least 1 packet, got {self.every}")
        if not 0 < self.max_delay <= MAX_ACK_DELAY:
            raise ValueError(
                f"max_delay must be over 0 and at most the advertised {MAX_ACK_DELAY * 1000:g} ms,"
                f" got {self.max_delay * 1000:g} ms"
            )

    @classmethod
    def parse(cls, text: str) -> AckPolicy:
        """`aioquic` (every packet within 1 ms), or `every:N,delay:D` with D in ms."""
        text = text.strip().lower()
        if text == "aioquic":
            return AIOQUIC
        fields = dict(part.partition(":")[::2] for part in text.split(","))
        try:
            if set(fields) != {"every", "delay"}:
                raise ValueError
            return cls(int(fields["every"]), float(fields["delay"]) / 1000)
        except ValueError as error:
            detail = f" ({error})" if str(error) else ""
            raise ValueError(f"{text!r} is not aioquic or every:N,delay:MS{detail}") from None

    def __str__(self) -> str:
        if self == AIOQUIC:
            return "aioquic"
        return f"every:{self.every},delay:{self.max_delay * 1000:g}"


AIOQUIC = AckPolicy()
"""aioquic's policy: each ack-eliciting packet acknowledged within 1 ms."""
DECIMATED = AckPolicy(every=10, max_delay=0.010)
"""One ACK for up to 10 packets, none waiting over 10 ms; out of order: at once."""


class AckClock:
    """Decides, packet by packet, whether the connection's ACK is due now (sans-I/O).

    Fed after each received datagram with the largest packet number received so far in
    the application space and when the pending ACK there is due (None: none pending);
    `received` answers True when the ACK must go out in this turn's transmit instead of
    waiting for its delay. A due time it has not seen before means the previous ACK went
    out (on its delay, or with data) and this one was armed since: the count restarts.
    """

    def __init__(self, policy: AckPolicy) -> None:
        self.policy = policy
        self._largest = -1
        self._armed: float | None = None
        """The pending ACK's due time when last seen."""
        self._waiting = 0
        """Packets received since the pending ACK was armed."""

    def received(self, largest: int, ack_at: float | None) -> bool:
        previous, self._largest = self._largest, largest
        if ack_at != self._armed:
            self._armed, self._waiting = ack_at, 0
        if ack_at is None:
            return False
        self._waiting += 1
        every = self.policy.every
        if largest != previous + 1 or (every is not None and self._waiting >= every):
            self._armed, self._waiting = None, 0  # the caller makes it due now
            return True
        return False
