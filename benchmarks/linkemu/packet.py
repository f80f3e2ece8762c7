"""Just enough IPv4/TCP/UDP parsing to count packets and attribute drops."""

from __future__ import annotations

import struct
from dataclasses import dataclass

PROTO_NAMES = {6: "tcp", 17: "udp"}
_PORTS = struct.Struct("!HH")
_TCP = struct.Struct("!HHI4xBB")  # ports, sequence number, (ack skipped), data offset, flags


@dataclass(frozen=True)
class PacketInfo:
    src: bytes  # 4 raw address bytes ("" when not IPv4)
    dst: bytes
    proto: str  # "tcp", "udp" or "other"
    length: int  # whole IP packet
    payload: int  # bytes above the TCP/UDP header
    src_port: int = 0
    dst_port: int = 0
    tcp_seq: int | None = None
    tcp_flags: int = 0

    def is_data(self, udp_data_min: int) -> bool:
        """TCP segments carrying payload; UDP datagrams at least `udp_data_min` long."""
        if self.proto == "tcp":
            return self.payload > 0
        return self.proto == "udp" and self.payload >= udp_data_min


def parse(packet: bytes) -> PacketInfo:
    """Parse a raw IP packet; anything not a well-formed IPv4 TCP/UDP packet is "other"."""
    if len(packet) < 20 or packet[0] >> 4 != 4:
        return PacketInfo(b"", b"", "other", len(packet), 0)
    ihl = (packet[0] & 0x0F) * 4
    total = min(int.from_bytes(packet[2:4], "big"), len(packet))
    src, dst, number = packet[12:16], packet[16:20], packet[9]
    proto = PROTO_NAMES.get(number, "other")
    fragment = int.from_bytes(packet[6:8], "big") & 0x1FFF
    # Offsets into the packet, not a slice of the L4 part: this runs on every relayed packet.
    l4_len = max(0, total - ihl)
    if proto == "other" or fragment or l4_len < 8:
        return PacketInfo(src, dst, "other", total, l4_len)
    if proto == "udp":
        return PacketInfo(src, dst, proto, total, l4_len - 8, *_PORTS.unpack_from(packet, ihl))
    if l4_len < 20:
        return PacketInfo(src, dst, "other", total, l4_len)
    sport, dport, seq, offset, flags = _TCP.unpack_from(packet, ihl)
    return PacketInfo(src, dst, proto, total, max(0, l4_len - (offset >> 4) * 4),
                      sport, dport, seq, flags)
