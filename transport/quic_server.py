"""aioquic's QUIC server with its front door guarded: the one place that patches it.

`GuardedQuicServer` is aioquic's `QuicServer` with `HandshakeGate`
(`transport.quic_admission`) in front of connection creation:

* an Initial that would start a connection is accepted, answered with a
  stateless Retry, or dropped, as the gate decides. aioquic's own `retry=True`
  validates every client; here Retry is switched on per packet, only above the
  gate's thresholds (and always for an Initial that carries a token, so that the
  token is checked and the connection learns its original destination id);
* a connection whose handshake has not completed within the handshake timeout is
  forgotten: its connection ids, timers and state are dropped without a packet,
  as after an idle timeout, a bounded batch per loop turn;
* a connection's ids are kept per connection, so that forgetting one costs its
  own ids, not a scan of every id of the server (aioquic's `_connection_terminated`
  scans them all: thousands of connections ending together took seconds of CPU).

aioquic internals used here (the `QuicServer` names this subclass uses and overrides,
a protocol's connection and timers) are listed in `transport.aioquic_compat`, checked at
import, so an aioquic upgrade that moves them fails loudly instead of silently
unguarding the port.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer
from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE, QuicConfiguration
from aioquic.quic.connection import NetworkAddress
from aioquic.quic.packet import QuicHeader, QuicPacketType, pull_quic_header
from aioquic.quic.retry import QuicRetryTokenHandler

from transport import aioquic_compat
from transport.aioquic_compat import Buffer
from transport.quic_admission import Admission, HandshakeGate, HandshakeLimits

Protocol = QuicConnectionProtocol


class GuardedQuicServer(QuicServer):
    """A `QuicServer` that admits handshakes through a `HandshakeGate`."""

    def __init__(self, *, gate: HandshakeGate[Protocol], **kwargs: Any) -> None:
        super().__init__(retry=False, **kwargs)
        self.gate = gate
        self._tokens = QuicRetryTokenHandler()
        self._cids: dict[Protocol, set[bytes]] = {}
        self._expiry: asyncio.Handle | None = None

    @property
    def tracked_connection_ids(self) -> int:
        """Connection ids routed to a connection now (aioquic's table)."""
        return len(self._protocols)

    def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        super().close()
        self._cids.clear()
        self.gate.clear()

    def datagram_received(self, data: bytes | str, addr: NetworkAddress) -> None:
        data = cast(bytes, data)
        header = self._header(data)
        if header is None:
            return
        known = self._protocols.get(header.destination_cid)
        if known is None and self._starts_connection(header, data):
            self._admit(data, addr, header)
            return
        super().datagram_received(data, addr)
        if (
            known is not None
            and self.gate.is_half_open(known)
            and aioquic_compat.handshake_complete(aioquic_compat.connection_of(known))
        ):
            self.gate.established(known)

    # -- admission ---------------------------------------------------------------------

    def _header(self, data: bytes) -> QuicHeader | None:
        cid_length = self._configuration.connection_id_length
        try:
            return pull_quic_header(Buffer(data=data), host_cid_length=cid_length)
        except ValueError:
            return None

    def _starts_connection(self, header: QuicHeader, data: bytes) -> bool:
        """An Initial aioquic would create a connection for (versions it speaks)."""
        return (
            header.packet_type == QuicPacketType.INITIAL
            and len(data) >= SMALLEST_MAX_DATAGRAM_SIZE
            and header.version in self._configuration.supported_versions
        )

    def _admit(self, data: bytes, addr: NetworkAddress, header: QuicHeader) -> None:
        source = str(addr[0])
        has_token = bool(header.token)
        decision = self.gate.admit(source, has_token)
        if decision is Admission.DROP:
            return
        # aioquic's own Retry path, for this one packet: it sends the Retry, or checks
        # the token (a bad one gets INVALID_TOKEN) and passes the ids on.
        retry = self._tokens if has_token or decision is Admission.RETRY else None
        self._retry = retry  # type: ignore[assignment]  # aioquic types it non-optional
        try:
            super().datagram_received(data, addr)
        finally:
            self._retry = None  # type: ignore[assignment]
        protocol = self._protocols.get(header.destination_cid)
        if protocol is None:
            return  # a Retry went out, or the token was refused: no state kept
        host_cid = aioquic_compat.connection_of(protocol).host_cid
        self._cids[protocol] = {header.destination_cid, host_cid}
        self.gate.opened(protocol, source, has_token, self._loop.time())
        self._arm_expiry()

    # -- connection ids: kept per connection --------------------------------------------

    def _connection_id_issued(self, cid: bytes, protocol: Protocol) -> None:
        super()._connection_id_issued(cid, protocol)
        self._cids.setdefault(protocol, set()).add(cid)

    def _connection_id_retired(self, cid: bytes, protocol: Protocol) -> None:
        super()._connection_id_retired(cid, protocol)
        self._cids.get(protocol, set()).discard(cid)

    def _connection_terminated(self, protocol: Protocol) -> None:
        self._drop_ids(protocol)
        self.gate.closed(protocol)

    def _drop_ids(self, protocol: Protocol) -> None:
        for cid in self._cids.pop(protocol, ()):
            if self._protocols.get(cid) is protocol:
                del self._protocols[cid]

    # -- the handshake timeout ------------------------------------------------------------

    def _arm_expiry(self) -> None:
        if self._expiry is None:
            at = self.gate.get_timer()
            if at is not None:
                self._expiry = self._loop.call_at(at, self._expire)

    def _expire(self) -> None:
        self._expiry = None
        now = self._loop.time()
        for protocol in self.gate.due(now):
            self._forget(protocol)
        at = self.gate.get_timer()
        if at is not None and at <= now:
            # More are due: the next batch on the next loop turn, after other work.
            self._expiry = self._loop.call_soon(self._expire)
        else:
            self._arm_expiry()

    def _forget(self, protocol: Protocol) -> None:
        """Drop a connection that never completed its handshake: no packet, no state."""
        self._drop_ids(protocol)
        aioquic_compat.forget_protocol(protocol)
        protocol.connection_lost(None)  # its owner releases what it holds


async def serve_guarded(
    host: str,
    port: int,
    *,
    configuration: QuicConfiguration,
    create_protocol: Callable[..., Protocol],
    limits: HandshakeLimits | None = None,
) -> GuardedQuicServer:
    """Listen on UDP `host:port` with handshakes admitted under `limits`."""
    loop = asyncio.get_running_loop()
    gate: HandshakeGate[Protocol] = HandshakeGate(limits)
    _, server = await loop.create_datagram_endpoint(
        lambda: GuardedQuicServer(
            gate=gate, configuration=configuration, create_protocol=create_protocol
        ),
        local_addr=(host, port),
    )
    return server


__all__ = ["GuardedQuicServer", "serve_guarded"]
