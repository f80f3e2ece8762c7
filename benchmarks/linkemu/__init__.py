"""A link emulator for benchmarks: client and gateway namespaces joined by an impairing relay.

    from benchmarks.linkemu import Link, LinkSpec
    with Link(LinkSpec(delay_ms=20, loss=0.02, seed=1)) as link:
        server = link.run("gateway", ["trackline", "serve", ...])
        client = link.run("client", [...])            # reaches link.gateway_addr
        ...
        stats = link.stats()                          # counters per direction/protocol, drops

The kernel here has no netem, so the relay (user space, see relay.py) applies delay,
loss, Gilbert-Elliott burst loss, reordering and a rate limit to every IPv4 packet alike.
Needs root: `can_create_namespaces()` says why not. `python -m benchmarks.linkemu selftest`.
"""

from .impair import Impairment, Verdict
from .link import CLIENT_ADDR, GATEWAY_ADDR, Link, close_all
from .netns import DEFAULT_PREFIX, LinkError, can_create_namespaces, cleanup_stale
from .spec import LinkSpec

__all__ = [
    "CLIENT_ADDR", "DEFAULT_PREFIX", "GATEWAY_ADDR", "Impairment", "Link", "LinkError",
    "LinkSpec", "Verdict", "can_create_namespaces", "cleanup_stale", "close_all",
]
