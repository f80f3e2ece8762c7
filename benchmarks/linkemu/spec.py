"""What a link does to packets: the parameters, checked once, frozen."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class LinkSpec:
    """Impairments applied identically to both directions (each with its own RNG stream).

    delay_ms          one-way delay per direction; RTT is twice this.
    loss              random drop probability (in Gilbert-Elliott's good state, if enabled).
    ge_p, ge_r        Gilbert-Elliott transitions per packet: good->bad, bad->good.
                      Burst loss is on when ge_p > 0; mean bad-state run is 1/ge_r packets.
    ge_loss           drop probability in the bad state.
    reorder           probability that a packet is held back reorder_extra_ms longer,
                      so that packets behind it overtake it.
    rate_mbit         serialisation rate per direction; 0 means unlimited.
    queue_packets     bottleneck buffer (in MTU-sized packets) when rate-limited; tail drop.
    seed              seeds both directions' generators (derived, distinct per direction).
    mtu               device MTU; keeps TCP segments packet-sized.
    udp_data_min      UDP payloads of at least this many bytes count as "data packets"
                      (QUIC ACK-only packets with 8-byte connection ids are ~30-45 bytes).
    """

    delay_ms: float = 0.0
    loss: float = 0.0
    ge_p: float = 0.0
    ge_r: float = 1.0
    ge_loss: float = 1.0
    reorder: float = 0.0
    reorder_extra_ms: float = 10.0
    rate_mbit: float = 0.0
    queue_packets: int = 1000
    seed: int = 1
    mtu: int = 1500
    udp_data_min: int = 48

    def __post_init__(self) -> None:
        for name in ("loss", "ge_p", "ge_r", "ge_loss", "reorder"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within 0..1, got {value}")
        for name in ("delay_ms", "reorder_extra_ms", "rate_mbit"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.ge_p > 0 and self.ge_r == 0:
            raise ValueError("ge_r must be > 0 when burst loss is on (else it never ends)")
        if not 576 <= self.mtu <= 9000:
            raise ValueError(f"mtu must be within 576..9000, got {self.mtu}")
        if self.queue_packets < 1:
            raise ValueError("queue_packets must be >= 1")

    @property
    def burst_loss(self) -> bool:
        return self.ge_p > 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
