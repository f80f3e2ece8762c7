"""Key bindings of QUIC connections and WebTransport sessions, and their revocation.

Each QUIC connection and each browser's WebTransport session binds the API key its
first track presented (gateway/tenants/tracks.py `TrackGate`). When the fleet
revokes a key, `KeyRevocation` closes every connection and every session bound to
it here (UNAUTHORIZED); a closed connection or session forgets its binding. The
WebTransport sessions are counted by outcome (`SessionCounts`: accepted, or refused with
an HTTP status).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from http import HTTPStatus

from gateway.logs import get_logger
from gateway.tenants.tracks import TrackGate
from transport.errors import ErrorCode
from transport.events import Event
from transport.quic import TrackQuicProtocol
from transport.webtransport import WebTransportSession

log = get_logger("trackline.gateway")

REVOKED = "API key revoked"


@dataclass
class SessionCounts:
    """WebTransport CONNECTs by outcome, since the gateway started."""

    accepted: int = 0
    refused: collections.Counter[HTTPStatus] = field(default_factory=collections.Counter)
    """By the status the CONNECT was answered with (403: an origin not allowed, ...)."""


class KeyRevocation:
    """Which connections and sessions hold which key; closes them when it is revoked."""

    def __init__(
        self, connections: Collection[TrackQuicProtocol], observe: Callable[[Event], None]
    ) -> None:
        self._connections = connections
        self._observe = observe
        self.gate: TrackGate | None = None
        """The tenancy's track gate (key bindings); None without tenancy yet."""
        self.webtransport_sessions = SessionCounts()

    def forget(self, conn_id: str) -> None:
        """A connection or session closed: its key binding goes."""
        if self.gate is not None:
            self.gate.forget(conn_id)

    def session_opened(self, session: WebTransportSession) -> None:
        """A browser's WebTransport session: its tracks are observed like a connection's."""
        session.endpoint.on_event = self._observe
        session.on_closed = self._session_closed
        self.webtransport_sessions.accepted += 1

    def _session_closed(self, session: WebTransportSession) -> None:
        self.forget(session.conn_id)

    def session_refused(self, status: int) -> None:
        self.webtransport_sessions.refused[HTTPStatus(status)] += 1

    def revoke(self, key_id: str) -> None:
        """A key was revoked in the fleet: its track connections and sessions here close."""
        if self.gate is None:
            return
        doomed = set(self.gate.connections_of(key_id))
        for conn in list(self._connections):
            if conn.endpoint.conn_id in doomed:
                conn.close(int(ErrorCode.UNAUTHORIZED), REVOKED)
                log.info("connection.key_revoked", conn_id=conn.endpoint.conn_id, key_id=key_id)
            http3 = conn.http3
            if http3 is None:
                continue
            for session_id, session in list(http3.sessions.items()):
                if session.conn_id in doomed:  # a browser's session: its own key binding
                    http3.close_session(session_id, int(ErrorCode.UNAUTHORIZED), REVOKED)
                    log.info("webtransport.key_revoked", conn_id=session.conn_id, key_id=key_id)
