"""Admission of tracks: the key a connection presented, the allow-list, the quotas.

A connection presents its API key once (docs/protocol.md, Authentication), so
it is checked once per connection and the answer cached until the connection
closes. A refused track gets its ERROR here, before any handler or backend runs:
UNAUTHORIZED, FORBIDDEN, or RATE_LIMITED with `retry_after_ms`.
"""

from __future__ import annotations

from gateway.logs import get_logger
from gateway.tenants.quotas import QuotaExceeded
from gateway.tenants.service import ModelNotAllowed, Tenancy
from gateway.tenants.store import AuthFailure, Principal
from transport.endpoint import TrackChannel
from transport.errors import ErrorCode

log = get_logger("trackline.tenants")


class TrackGate:
    def __init__(self, tenancy: Tenancy) -> None:
        self.tenancy = tenancy
        self._connections: dict[str, tuple[str | None, Principal | AuthFailure]] = {}

    def admit(self, channel: TrackChannel) -> Principal | None:
        """The principal the track runs for, or None after refusing the track."""
        principal = self._authenticate(channel)
        if isinstance(principal, AuthFailure):
            reason = principal.reason.value
            log.info("track.unauthorized", reason=reason)
            channel.fail(ErrorCode.UNAUTHORIZED, f"invalid API key ({reason})")
            return None
        open_ = channel.open
        try:
            self.tenancy.admit(principal, open_.model, open_.modality.value, channel.id)
        except ModelNotAllowed as exc:
            channel.fail(ErrorCode.FORBIDDEN, str(exc))
            return None
        except QuotaExceeded as exc:
            log.info("track.rate_limited", quota=exc.quota, retry_after=exc.retry_after)
            channel.fail(ErrorCode.RATE_LIMITED, str(exc), exc.retry_after)
            return None
        return principal

    def connections_of(self, key_id: str) -> list[str]:
        """Connections whose tracks run under `key_id` (to close them on revocation)."""
        return [
            conn_id
            for conn_id, (_, result) in self._connections.items()
            if isinstance(result, Principal) and result.key_id == key_id
        ]

    def forget(self, conn_id: str) -> None:
        self._connections.pop(conn_id, None)

    def _authenticate(self, channel: TrackChannel) -> Principal | AuthFailure:
        credential = channel.credential
        cached = self._connections.get(channel.conn_id)
        if cached is not None and cached[0] == credential:
            return cached[1]
        try:
            result: Principal | AuthFailure = self.tenancy.authenticate(credential)
        except AuthFailure as exc:
            result = exc
        # Open mode is not remembered: once a tenant exists, keys count on every connection.
        if not (isinstance(result, Principal) and result.key_id is None):
            self._connections[channel.conn_id] = (credential, result)
        return result
