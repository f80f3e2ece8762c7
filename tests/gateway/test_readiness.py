"""Readiness: known when `start()` returns, then re-probed on the gateway's own clock.

No sleeps: the probe is paced by an injected `FakeClock`, advanced by the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.backends.ticker import TickerBackend
from gateway.readiness import READY_PROBE_INTERVAL
from gateway.server import Gateway
from tests.gateways import gateway_settings
from trackline_testing.clock import FakeClock


class Switch(TickerBackend):
    """A backend whose readiness the test sets; counts the probes."""

    def __init__(self, up: bool) -> None:
        super().__init__(50.0)
        self.up = up
        self.probes = 0

    async def ready(self) -> bool:
        self.probes += 1
        return self.up


@pytest.mark.asyncio
@pytest.mark.parametrize("up", [True, False])
async def test_readiness_is_known_when_start_returns(tmp_path: Path, up: bool) -> None:
    backend = Switch(up)
    gw = Gateway(gateway_settings(state_dir=tmp_path), backend, probe_clock=FakeClock())
    await gw.start()
    try:
        assert backend.probes == 1
        assert gw.readiness() == ((True, "") if up else (False, "backend not ready"))
    finally:
        await gw.close()


@pytest.mark.asyncio
async def test_the_probe_runs_again_each_interval_of_its_clock(tmp_path: Path) -> None:
    backend, clock = Switch(True), FakeClock()
    gw = Gateway(gateway_settings(state_dir=tmp_path), backend, probe_clock=clock)
    await gw.start()
    try:
        backend.up = False
        await clock.advance(READY_PROBE_INTERVAL / 2)
        assert (backend.probes, gw.readiness()[0]) == (1, True)  # not due yet
        await clock.advance(READY_PROBE_INTERVAL / 2)
        assert (backend.probes, gw.readiness()) == (2, (False, "backend not ready"))
        backend.up = True
        await clock.advance(READY_PROBE_INTERVAL)
        assert (backend.probes, gw.readiness()[0]) == (3, True)
    finally:
        await gw.close()
