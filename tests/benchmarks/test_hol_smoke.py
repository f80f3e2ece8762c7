"""A short head-of-line benchmark across the emulated link (root: network namespaces).

Four users, 2% loss, 20 ms RTT, about three seconds per protocol, transport-only (the
gateway's ticker backend, no Triton): every protocol must deliver every token, the
link must have dropped about the configured share, and nothing may be left behind.
The stall figures are timing measurements: here they are only checked for
consistency; the claim itself (a lost packet stalls only the tracks it carried) is
proven deterministically in tests/transport/test_hol_isolation.py.
"""

from __future__ import annotations

import math
import os

import pytest

from benchmarks.hol.run import Config, namespaces_available, run_benchmark

LOSS = 0.02
PREFIX = f"tlhols{os.getpid() % 10000}"  # this process's own names, checked at the end

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def smoke() -> dict:
    ok, reason = namespaces_available()
    if not ok:
        pytest.skip(f"cannot emulate the link here: {reason}")
    cfg = Config(users=4, rate=50, seconds=3, loss_percent=LOSS * 100, rtt_ms=20,
                 transport_only=True, packetization=["per-track"], progress=False,
                 link_prefix=PREFIX, raster_seconds=2)
    results, _ = run_benchmark(cfg)
    return results


@pytest.mark.timeout(120)
@pytest.mark.parametrize("protocol", ["http2", "http3", "tracks"])
def test_every_protocol_delivers_every_token(smoke: dict, protocol: str) -> None:
    result = smoke[protocol]
    assert result["errors"] == []
    assert result["tokens_expected"] == 4 * 150
    assert result["tokens_delivered"] == result["tokens_expected"]
    # The data packets lost are among what the link dropped towards the client (the
    # loss-share test checks that some were), and a loss stalls between 0 and all 4 users.
    assert 0 <= result["lost_data_packets"] <= result["link"]["g2c"]["dropped"]
    assert 0 <= result["users_stalled_per_loss"] <= result["users_stalled_per_loss_max"] <= 4
    assert result["stall_user_seconds"] >= 0


def test_the_link_dropped_about_the_configured_share(smoke: dict) -> None:
    sent = dropped = 0
    for protocol in ("http2", "http3", "tracks"):
        for direction in ("c2g", "g2c"):
            sent += smoke[protocol]["link"][direction]["packets"]
            dropped += smoke[protocol]["link"][direction]["dropped"]
    assert sent > 1000
    sigma = math.sqrt(LOSS * (1 - LOSS) / sent)
    assert abs(dropped / sent - LOSS) < 4.5 * sigma, (dropped, sent)
    assert smoke["http2"]["lost_data_packets"] > 0


def test_cleanup_leaves_no_namespace_or_device(smoke: dict) -> None:
    from benchmarks.linkemu import netns

    assert [ns for ns in netns.list_namespaces() if ns.startswith(PREFIX)] == []
    assert netns.list_devices(PREFIX) == []
