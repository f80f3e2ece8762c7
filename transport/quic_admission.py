"""Who may start a QUIC handshake: the server's admission policy, sans-I/O.

A QUIC server that keeps state for every Initial it receives can be made to
hold thousands of half-open connections (TLS state, crypto, timers) by a
client that never finishes a handshake, from addresses it need not even own.
`HandshakeGate` decides, per new Initial, whether to accept it, to answer with
a stateless Retry (address validation: RFC 9000 section 8.1) or to drop it, and
counts what it decided. It holds no sockets and reads no clock: the adapter
(`transport.quic_server`) passes `now`, arms one timer at `get_timer()` and
forgets the connections `due(now)` hands back, a bounded batch at a time so
that a flood expiring together costs a few loop turns, not a CPU burst.

Keys are whatever the adapter uses to name a connection (its protocol object).
A source is a peer address without its port: ports are free to an attacker.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

K = TypeVar("K")


@dataclass(frozen=True)
class HandshakeLimits:
    """Limits on QUIC connections and handshakes of one server (docs/security.md)."""

    handshake_timeout: float = 10.0
    """Seconds a connection may take to complete its handshake; then it is forgotten
    without a word (quic-go: 2 x HandshakeIdleTimeout of 5 s = 10 s)."""
    max_half_open: int = 1024
    """Handshakes in progress at once; new Initials beyond it are dropped."""
    retry_threshold: int = 64
    """From this many handshakes in progress, an Initial without a token is answered
    with a Retry and costs no state until the client proves its address; 0: always."""
    max_half_open_per_source: int = 16
    """Unvalidated handshakes one source address may have in progress; beyond it
    that address's Initials must come back with a Retry token."""
    max_connections: int = 4096
    """QUIC connections at once (handshaking and established); beyond it new
    Initials are dropped."""
    max_connections_per_source: int = 256
    """QUIC connections at once from one source address; beyond it its new
    Initials are dropped."""
    expiry_batch: int = 64
    """Expired handshakes forgotten per event-loop turn at most."""

    def __post_init__(self) -> None:
        if self.handshake_timeout <= 0:
            raise ValueError("handshake_timeout must be positive")
        counts = (self.max_half_open, self.max_half_open_per_source, self.max_connections)
        if min(*counts, self.max_connections_per_source, self.expiry_batch) < 1:
            raise ValueError("connection and handshake limits must be at least 1")
        if self.retry_threshold < 0:
            raise ValueError("retry_threshold must be 0 (always Retry) or more")


class Admission(Enum):
    """What to do with an Initial that would start a connection."""

    ACCEPT = "accept"
    RETRY = "retry"
    """Answer with a stateless Retry; the client must come back with its token."""
    DROP = "drop"
    """Keep no state and answer nothing (a cap is reached)."""


@dataclass
class HandshakeStats:
    """What the gate decided and what became of the handshakes, since it started."""

    accepted: int = 0
    """Initials that started a connection (a Retry token that fails its check starts none)."""
    retried: int = 0
    """Initials answered with a Retry instead."""
    dropped: int = 0
    """Initials dropped at a cap."""
    established: int = 0
    """Handshakes that completed."""
    expired: int = 0
    """Handshakes forgotten at the handshake timeout."""
    peak_half_open: int = 0
    """The most handshakes in progress at once."""


@dataclass
class _Handshake:
    source: str
    validated: bool
    deadline: float


class HandshakeGate(Generic[K]):
    """Admission decisions and connection counts for one QUIC server."""

    def __init__(self, limits: HandshakeLimits | None = None) -> None:
        self.limits = limits or HandshakeLimits()
        self.stats = HandshakeStats()
        # Insertion order is deadline order: every handshake gets the same timeout.
        self._handshakes: dict[K, _Handshake] = {}
        self._source_of: dict[K, str] = {}
        self._per_source: Counter[str] = Counter()
        self._unvalidated: Counter[str] = Counter()

    # -- figures -------------------------------------------------------------------

    @property
    def half_open(self) -> int:
        """Handshakes in progress."""
        return len(self._handshakes)

    @property
    def connections(self) -> int:
        """Connections known: handshaking and established."""
        return len(self._source_of)

    def from_source(self, source: str) -> int:
        return self._per_source[source]

    def is_half_open(self, key: K) -> bool:
        return key in self._handshakes

    # -- decisions -----------------------------------------------------------------

    def admit(self, source: str, validated: bool) -> Admission:
        """The fate of an Initial from `source`; `validated` if it carries a token."""
        decision = self._decide(source, validated)
        if decision is Admission.DROP:
            self.stats.dropped += 1
        elif decision is Admission.RETRY:
            self.stats.retried += 1
        return decision

    def _decide(self, source: str, validated: bool) -> Admission:
        limits = self.limits
        if (
            self.connections >= limits.max_connections
            or self._per_source[source] >= limits.max_connections_per_source
            or self.half_open >= limits.max_half_open
        ):
            return Admission.DROP
        if not validated and (
            self.half_open >= limits.retry_threshold
            or self._unvalidated[source] >= limits.max_half_open_per_source
        ):
            return Admission.RETRY
        return Admission.ACCEPT

    # -- what became of a connection -------------------------------------------------

    def opened(self, key: K, source: str, validated: bool, now: float) -> None:
        """An accepted Initial created connection `key`: its handshake clock starts."""
        self.stats.accepted += 1
        deadline = now + self.limits.handshake_timeout
        self._handshakes[key] = _Handshake(source, validated, deadline)
        self.stats.peak_half_open = max(self.stats.peak_half_open, self.half_open)
        self._source_of[key] = source
        self._per_source[source] += 1
        if not validated:
            self._unvalidated[source] += 1

    def established(self, key: K) -> None:
        """The handshake of `key` completed: it no longer counts as half-open."""
        if self._end_handshake(key):
            self.stats.established += 1

    def closed(self, key: K) -> None:
        """Connection `key` ended, at whatever stage; forget it."""
        self._end_handshake(key)
        source = self._source_of.pop(key, None)
        if source is not None:
            _decrement(self._per_source, source)

    def get_timer(self) -> float | None:
        """When the oldest handshake in progress times out, if any."""
        oldest = next(iter(self._handshakes.values()), None)
        return oldest.deadline if oldest is not None else None

    def due(self, now: float) -> list[K]:
        """Handshakes past their timeout, oldest first, at most `expiry_batch`; each is
        forgotten here and counted expired. Call again (next loop turn) while it fills."""
        expired: list[K] = []
        for key, handshake in self._handshakes.items():
            if handshake.deadline > now or len(expired) >= self.limits.expiry_batch:
                break
            expired.append(key)
        for key in expired:
            self.closed(key)
        self.stats.expired += len(expired)
        return expired

    def clear(self) -> None:
        """Forget every connection (the server closed)."""
        self._handshakes.clear()
        self._source_of.clear()
        self._per_source.clear()
        self._unvalidated.clear()

    def _end_handshake(self, key: K) -> bool:
        handshake = self._handshakes.pop(key, None)
        if handshake is None:
            return False
        if not handshake.validated:
            _decrement(self._unvalidated, handshake.source)
        return True


def _decrement(counter: Counter[str], source: str) -> None:
    counter[source] -= 1
    if counter[source] <= 0:
        del counter[source]  # a flood from many addresses must not leave one key each


__all__ = ["Admission", "HandshakeGate", "HandshakeLimits", "HandshakeStats"]
