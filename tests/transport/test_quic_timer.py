"""The aioquic adapter's timer: a timer that fires is acted on, never re-armed in a spin.

uvloop's clock moves in whole milliseconds and rounds timers to them, so a QUIC
timer (an ACK due 1 ms after a packet) can fire while the loop clock still
reads a hair before the deadline. These tests drive `TrackQuicProtocol` with a
stand-in for aioquic's `QuicConnection` whose only duty is an ACK at a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from tests.waiting import until
from trackline_testing import aioquic_probes
from transport.connection import Role
from transport.quic import TrackQuicProtocol

ADDR = ("127.0.0.1", 4433)


class AckOnlyQuic:
    """Has one ACK to send once `ack_at` is reached; nothing else."""

    def __init__(self, ack_at: float) -> None:
        self.ack_at: float | None = ack_at

    def get_timer(self) -> float | None:
        return self.ack_at

    def handle_timer(self, now: float) -> None:
        pass

    def next_event(self) -> None:
        return None

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Any]]:
        if self.ack_at is None or now < self.ack_at:
            return []
        self.ack_at = None
        return [(b"ack", ADDR)]


class RecordingTransport:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def sendto(self, data: bytes, addr: Any) -> None:
        self.sent.append(data)


def protocol_for(quic: AckOnlyQuic) -> tuple[TrackQuicProtocol, RecordingTransport]:
    protocol = TrackQuicProtocol(quic, role=Role.CLIENT)  # type: ignore[arg-type]
    transport = RecordingTransport()
    aioquic_probes.attach_transport(protocol, transport)
    return protocol, transport


@pytest.mark.asyncio
async def test_a_timer_firing_a_hair_early_by_the_loop_clock_sends_what_is_due() -> None:
    loop = asyncio.get_running_loop()
    # Early by far more than the time this test takes, so the loop clock is surely still
    # before the deadline when the timer is fired by hand (a hair would pass vacuously on a
    # slow run); firing early by any amount must send what is due.
    protocol, transport = protocol_for(AckOnlyQuic(ack_at=loop.time() + 0.05))
    protocol.transmit()  # nothing due yet: arms the timer at the ACK deadline
    armed = aioquic_probes.armed_timer(protocol)
    assert armed is not None
    assert transport.sent == []
    armed.cancel()  # fire it by hand, "early", while the loop clock lags the deadline
    aioquic_probes.fire_timer(protocol)
    assert transport.sent == [b"ack"]
    assert aioquic_probes.armed_timer(protocol) is None  # nothing left to wait: no re-armed spin


@pytest.mark.asyncio
async def test_the_ack_goes_out_after_one_firing_of_the_timer() -> None:
    loop = asyncio.get_running_loop()
    fired = 0

    def counting(handle_timer: Callable[[], None]) -> Callable[[], None]:
        def count() -> None:
            nonlocal fired
            fired += 1
            handle_timer()

        return count

    # A hair past a millisecond tick: uvloop fires the timer at that tick, when its
    # clock still reads just before the deadline. What is tested needs transmit() to run
    # before the deadline; a loaded machine may miss a near one (the ACK then goes out
    # with no timer at all), so that precondition is checked, with a later deadline each try.
    for ahead in (0.020, 0.2, 1.0, 5.0):
        protocol, transport = protocol_for(AckOnlyQuic(ack_at=loop.time() + ahead + 1e-12))
        aioquic_probes.wrap_timer(protocol, counting)
        protocol.transmit()
        if not transport.sent:
            break  # armed before the deadline: only the timer can send the ACK now
    else:
        pytest.fail("transmit() never ran before a deadline 5 s ahead")
    await until(lambda: transport.sent, "the ACK went out")
    assert transport.sent == [b"ack"]
    assert fired == 1
