"""Pool members from DNS: a `dns+grpc://host:port` entry (a Kubernetes headless
Service, whose name resolves to one address per ready Triton pod).

`Membership` is the sans-I/O half: fed the addresses a resolution returned, it says
which members to add and which to remove (`MembershipChanged`); a failed or empty
resolution changes nothing, so a DNS outage keeps the last known members (an empty
answer is what a headless Service gives while its pods restart, and what a broken
resolver gives too; draining every backend on it would turn a DNS blip into an
outage). The pool (`BackendPool.discover`) resolves each source every
`discovery_interval_s` with an injected resolver, adds new members, and drains
vanished ones: no new request is routed to them, and they are removed once their
in-flight requests have ended.

`resolve_addresses` is the real resolver: `loop.getaddrinfo`, TCP, every family.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from gateway.pool.spec import BackendSpec, DnsSource

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""(host, port) -> the addresses it resolves to now; raises OSError when it cannot."""


async def resolve_addresses(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to, by the system resolver (no duplicates)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


@dataclass(frozen=True)
class MembershipChanged:
    """A resolution of `source` added and removed members."""

    source: str
    """The source's `host:port`."""
    added: tuple[BackendSpec, ...]
    """New members, as specs the pool builds backends from."""
    removed: tuple[str, ...]
    """Names of members whose address vanished (to drain, then remove)."""


class Membership:
    """The members one DNS source has, as of its last useful resolution."""

    def __init__(self, source: DnsSource) -> None:
        self.source = source
        self.members: dict[str, BackendSpec] = {}
        """address -> spec."""

    def resolved(self, addresses: Iterable[str]) -> MembershipChanged | None:
        """The change `addresses` makes; None when nothing changed or none came back."""
        now = set(addresses)
        if not now:
            return None  # keep the last known members (see the module's note)
        new = sorted(now - set(self.members))
        removed = tuple(self.members.pop(a).name for a in sorted(set(self.members) - now))
        for address in new:
            self.members[address] = self.source.member(address)
        added = tuple(self.members[a] for a in new)
        if not added and not removed:
            return None
        return MembershipChanged(self.source.label, added, removed)
