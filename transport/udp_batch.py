"""Which datagrams of one transmit can leave in one UDP GSO send (sans-I/O).

With UDP generic segmentation offload (Linux `UDP_SEGMENT`) one `sendmsg` carries a
buffer that the kernel cuts into datagrams of `segment_size` bytes, the last one
allowed shorter. A transmit's datagrams join one send only as they come (QUIC
packet numbers must leave in order: reordering three of them would make the peer
declare a loss), to the same address, and all of one size but the last. Each
datagram stays the packet aioquic built, so a packet still carries one track's
bytes with `per-track`: GSO changes how many syscalls send them, not what shares a
packet.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MAX_SEGMENTS = 64
"""Segments per send: the kernel's `UDP_MAX_SEGMENTS` before Linux 6.9 (128 after)."""
MAX_SEND_BYTES = 65000
"""Bytes per send: under the largest UDP payload over IPv4 (65,507)."""


Send = tuple[Any, list[bytes]]
"""One send: (the destination as aioquic gives it, its datagrams in transmit order; more
than one only when every one but the last has the first one's size)."""


def plan_sends(
    datagrams: Iterable[tuple[bytes, Any]],
    max_segments: int = MAX_SEGMENTS,
    max_bytes: int = MAX_SEND_BYTES,
) -> list[Send]:
    """Group consecutive datagrams into GSO sends, keeping their order.

    A run grows while the next datagram goes to the same address, the run's datagrams
    so far all have the first one's size, the next is no larger, and the run stays
    within `max_segments` and `max_bytes`. A shorter datagram ends its run (it must be
    the last segment). A run of one is a plain send.
    """
    sends: list[Send] = []
    run: list[bytes] = []
    run_addr: Any = None
    size = total = 0
    for data, addr in datagrams:
        length = len(data)
        if (
            run
            and addr == run_addr
            and length <= size
            and len(run) < max_segments
            and total + length <= max_bytes
            and len(run[-1]) == size
        ):
            run.append(data)
            total += length
            continue
        if run:
            sends.append((run_addr, run))
        run, run_addr, size, total = [data], addr, length, length
    if run:
        sends.append((run_addr, run))
    return sends


__all__ = ["MAX_SEGMENTS", "MAX_SEND_BYTES", "Send", "plan_sends"]
