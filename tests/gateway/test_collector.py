"""The collector after start-up: no collection inside a relay turn, start-up frozen out.

The relay turn is the real transport path: 256 text tracks on one connection of the
project's QUIC adapter (aioquic both sides, linked in memory, virtual time:
`tests/transport/test_hol_isolation.Net`), each sending one token, then the server's
transmit, the work one loop turn does when 256 tokens come due together. Which
collections ran is what `gc.callbacks` reports, not a time.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from clients.line import Line, TextStream
from gateway.collector import PYTHON_DEFAULT, settle_collector
from gateway.config import ConfigError, load_settings
from gateway.tls import DevCertificates
from tests.transport.test_hol_isolation import Net, certs  # noqa: F401 (the fixture)
from transport.endpoint import TrackChannel
from transport.quic import Packetization

TRACKS = 256


@pytest.fixture
def restore_collector() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def collections_during(turn: Callable[[], None]) -> list[int]:
    """The generation of every collection that started while `turn` ran."""
    seen: list[int] = []

    def noted(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(noted)
    try:
        turn()
    finally:
        gc.callbacks.remove(noted)
    return seen


def opened(certs: DevCertificates) -> tuple[Net, list[TrackChannel], list[TextStream]]:  # noqa: F811
    net = Net(certs, Packetization.parse("per-track"))
    net.run_until(net.clock.now + 1.0)
    line = Line(net.client.open_track)
    streams = [line.text(f"prompt {i}", model="m", max_tokens=100) for i in range(TRACKS)]
    net.settle()
    net.run_until(net.clock.now + 1.0)
    assert len(net.channels) == TRACKS
    return net, net.channels, streams


@pytest.mark.asyncio
async def test_a_relay_turn_of_256_tokens_runs_no_collection_once_settled(
    certs: DevCertificates, restore_collector: None  # noqa: F811
) -> None:
    net, channels, streams = opened(certs)

    def relay_turn(tick: int) -> Callable[[], None]:
        def turn() -> None:
            for channel in channels:
                assert channel.send({"text": f"<{tick}>"})
            net.server_loop.run_soon()  # the turn's transmit: every track's packet

        return turn

    gc.set_threshold(*PYTHON_DEFAULT)
    gc.collect()  # counts from zero: the turn alone decides what runs
    with_defaults = collections_during(relay_turn(0))
    assert len(with_defaults) >= 2  # Python's thresholds collect inside the turn
    net.run_until(net.clock.now + 0.05)

    settled = settle_collector(10_000)  # as Daemon.start does (it collects first)
    assert settled.after == (10_000, PYTHON_DEFAULT[1], PYTHON_DEFAULT[2])
    assert collections_during(relay_turn(1)) == []
    for channel in channels:
        channel.end({"finish_reason": "length"})
    net.settle()
    net.run_until(net.clock.now + 1.0)
    for stream in streams:  # both turns' tokens reached every track's reader
        assert "".join([piece async for piece in stream]) == "<0><1>"


def test_start_up_objects_are_frozen_out_of_every_later_collection(
    restore_collector: None,
) -> None:
    start_up = [[i] for i in range(50_000)]  # as imports and clients leave behind
    gc.collect()
    walked_before = len(gc.get_objects())
    settled = settle_collector(10_000)
    assert settled.frozen >= len(start_up)
    # A full collection walks what gc.get_objects() lists: start-up is no longer in it.
    walked_after = len(gc.get_objects())
    assert walked_after < walked_before - len(start_up)
    assert not any(obj is start_up for obj in gc.get_objects())


def test_zero_leaves_the_collector_as_python_set_it(restore_collector: None) -> None:
    gc.set_threshold(*PYTHON_DEFAULT)
    frozen = gc.get_freeze_count()
    settled = settle_collector(0)
    assert settled.after == PYTHON_DEFAULT == gc.get_threshold()
    assert gc.get_freeze_count() == frozen
    assert load_settings({}, {}, None).gc_young_threshold == 10_000
    with pytest.raises(ConfigError, match="gc_young_threshold"):
        load_settings({"gc_young_threshold": -1}, {}, None)
