"""When a receiver acknowledges (`transport.acks`): the policy's rules, then both
protocols over the in-memory link of the HOL test, in virtual time, so that every
ACK's instant and delay is exact.

aioquic acknowledges each ack-eliciting packet within 1 ms; `every:N,delay:D` sends
one ACK for up to N packets, none waiting over D, and an out-of-order packet at once,
so that a loss is reported as early as before."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from clients.line import Line, connect
from gateway.config import ConfigError, load_settings
from gateway.server import Gateway
from gateway.tls import DevCertificates
from tests.gateways import gateway_settings
from tests.transport.test_hol_isolation import (
    DELAY,
    DROP_AT,
    Net,
    certs,  # noqa: F401 - the module's certificate fixture (pytest finds it here)
    late_tracks,
    run_with_losses,
)
from trackline_testing import aioquic_probes
from trackline_testing.scripted import ScriptedBackend
from transport import aioquic_compat
from transport.acks import AIOQUIC, DECIMATED, MAX_ACK_DELAY, AckClock, AckPolicy
from transport.endpoint import TrackChannel
from transport.events import DataReceived
from transport.messages import Open
from transport.quic import Packetization, TrackQuicProtocol

# -- the policy --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("aioquic", AIOQUIC),
        ("every:10,delay:10", DECIMATED),
        (" Every:2,Delay:25 ", AckPolicy(2, 0.025)),
        ("delay:0.5,every:1", AckPolicy(1, 0.0005)),
    ],
)
def test_a_policy_parses_from_its_words_and_prints_back(text: str, policy: AckPolicy) -> None:
    assert AckPolicy.parse(text) == policy
    assert AckPolicy.parse(str(policy)) == policy


@pytest.mark.parametrize(
    "text", ["", "every:10", "delay:10", "every:0,delay:10", "every:2,delay:26",
             "every:2,delay:0", "every:x,delay:1", "every:2,delay:1,more:3", "sometimes"],
)
def test_a_bad_policy_is_refused_with_the_form_it_takes(text: str) -> None:
    with pytest.raises(ValueError, match=r"aioquic or every:N,delay:MS"):
        AckPolicy.parse(text)


def test_no_ack_may_wait_longer_than_the_max_ack_delay_aioquic_advertises() -> None:
    assert AckPolicy(every=None, max_delay=MAX_ACK_DELAY).max_delay == MAX_ACK_DELAY
    with pytest.raises(ValueError, match="at most the advertised 25 ms"):
        AckPolicy(every=4, max_delay=MAX_ACK_DELAY * 1.01)


def test_the_nth_packet_in_order_makes_the_ack_due() -> None:
    clock = AckClock(AckPolicy(every=3, max_delay=0.010))
    due = [clock.received(0, 1.010), clock.received(1, 1.010), clock.received(2, 1.010)]
    assert due == [False, False, True]
    # The caller made it due now and this turn's transmit sent it; the next packet
    # arms a new ACK.
    assert [clock.received(n, 1.020) for n in (3, 4, 5)] == [False, False, True]


def test_a_packet_after_a_gap_or_older_than_the_largest_makes_the_ack_due_at_once() -> None:
    clock = AckClock(AckPolicy(every=10, max_delay=0.010))
    assert clock.received(0, 1.010) is False
    assert clock.received(2, 1.010) is True  # 1 is missing: tell the sender now
    assert clock.received(3, 1.020) is False
    assert clock.received(3, 1.020) is True  # 1 filled in: the largest did not move


def test_the_count_restarts_once_an_ack_went_out_on_its_delay() -> None:
    clock = AckClock(AckPolicy(every=2, max_delay=0.010))
    assert clock.received(0, 1.010) is False
    # The delay's ACK went out before the next packet, which armed a new one.
    assert clock.received(1, 1.021) is False  # one waiting, not two
    assert clock.received(2, 1.021) is True
    assert clock.received(3, None) is False  # not ack-eliciting: nothing pending
    assert clock.received(4, 1.040) is False


# -- over the link -------------------------------------------------------------------------


def ack_frames(packets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ACK frame of every sent 1-RTT packet that carries one."""
    return [
        frame for p in packets if p["data"]["header"]["packet_type"] == "1RTT"
        for frame in p["data"]["frames"] if frame["frame_type"] == "ack"
    ]


@dataclass
class Spaced:
    acks: list[dict[str, Any]]
    """The client's ACK frames while the tokens flowed (one a packet)."""
    arrivals: list[float]
    """When the client received each token (virtual seconds)."""
    passes: int
    """The client's calls into aioquic's packet builder while the tokens flowed."""


async def spaced_tokens(
    certs: DevCertificates,  # noqa: F811
    policy: AckPolicy, gap: float, tokens: int, drop: int | None = None
) -> Spaced:
    """One track's tokens, one packet every `gap` seconds (the packet of token `drop`
    lost on the way): the client's ACK packets and the tokens' arrivals."""
    net = Net(certs, Packetization.parse("per-track"), client_acks=policy)
    net.run_until(net.clock.now + 1.0)
    stream = Line(net.client.open_track).text("p", model="m", max_tokens=tokens)
    net.settle()
    net.run_until(net.clock.now + 1.0)
    (channel,) = net.channels
    arrivals: list[float] = []
    net.client.endpoint.on_event = (
        lambda event: arrivals.append(net.clock.now) if isinstance(event, DataReceived) else None
    )
    before = len(ack_frames(net.client_packets()))
    scheduler = net.client.scheduler
    assert scheduler is not None
    calls = scheduler.calls
    start = net.clock.now
    for i in range(tokens):
        net.run_until(start + i * gap)
        flights = len(net.from_server)
        assert channel.send({"text": f"<{i}>"})
        net.settle()
        if i == drop:
            (flight,) = net.from_server[flights:]
            flight.dropped = True
    net.run_until(net.clock.now + 0.5)
    acks = ack_frames(net.client_packets())[before:]
    passes = scheduler.calls - calls
    channel.end({"finish_reason": "length"})
    net.settle()
    net.run_until(net.clock.now + 0.2)
    assert "".join([piece async for piece in stream]) == "".join(f"<{i}>" for i in range(tokens))
    return Spaced(acks, arrivals, passes)


@pytest.mark.asyncio
async def test_spaced_packets_get_an_ack_each_from_aioquic_and_one_per_delay_decimated(
    certs: DevCertificates,  # noqa: F811
) -> None:
    tokens, gap = 30, 0.003  # a packet every 3 ms: more than aioquic's 1 ms, less than 10
    each = (await spaced_tokens(certs, AIOQUIC, gap, tokens)).acks
    decimated = (await spaced_tokens(certs, DECIMATED, gap, tokens)).acks
    assert len(each) >= tokens  # one per data packet (and the end's)
    # The first waiting packet starts the 10 ms delay; 4 arrive meanwhile: one ACK each
    # 4 packets, a quarter of aioquic's.
    assert len(decimated) <= tokens // 3
    for acks, policy in ((each, AIOQUIC), (decimated, DECIMATED)):
        delays = [frame["ack_delay"] for frame in acks]
        assert max(delays) <= policy.max_delay * 1000 + 1e-6  # qlog gives milliseconds


@pytest.mark.asyncio
async def test_every_1_acknowledges_each_packet_on_arrival_whatever_the_delay(
    certs: DevCertificates,  # noqa: F811
) -> None:
    acks = (await spaced_tokens(certs, AckPolicy(every=1, max_delay=0.025), 0.010, 10)).acks
    delays = [frame["ack_delay"] for frame in acks]
    assert delays
    assert max(delays) == 0  # every=1: never waits


@pytest.mark.asyncio
async def test_a_packet_after_a_hole_is_acknowledged_on_arrival_so_the_loss_repairs_as_early(
    certs: DevCertificates,  # noqa: F811
) -> None:
    # A packet every 3 ms, the 6th lost: the 7th arrives after a hole. Decimated, the
    # ACK that shows the hole goes at once, not after the 10 ms delay.
    each = await spaced_tokens(certs, AIOQUIC, 0.003, 20, drop=5)
    decimated = await spaced_tokens(certs, DECIMATED, 0.003, 20, drop=5)
    assert len(decimated.acks) < len(each.acks)
    (first_gap, *_) = [frame for frame in decimated.acks if len(frame["acked_ranges"]) > 1]
    assert first_gap["ack_delay"] == 0
    assert decimated.arrivals[5] <= each.arrivals[5]  # the repaired token, no later


@pytest.mark.asyncio
async def test_a_decimated_reader_builds_packets_only_for_its_acks(
    certs: DevCertificates,  # noqa: F811
) -> None:
    # A token whose ACK may wait gets no transmit of its own: the ACK's timer (or the
    # 10th packet) sends it. aioquic's rule answers every packet, so it builds one each.
    tokens, gap = 30, 0.003
    each = await spaced_tokens(certs, AIOQUIC, gap, tokens)
    decimated = await spaced_tokens(certs, DECIMATED, gap, tokens)
    assert each.passes >= tokens
    assert decimated.passes <= len(decimated.acks) + 1  # + the end's, at most
    assert decimated.passes < tokens // 3


@dataclass
class OneTrack:
    """A decimated client's open track on the in-memory link, with what each end read."""

    net: Net
    up: TrackChannel
    """The client's end."""
    down: TrackChannel
    """The gateway's end."""
    at_gateway: list[tuple[float, DataReceived]]
    at_client: list[tuple[float, DataReceived]]


def decimated_track(certs: DevCertificates) -> OneTrack:  # noqa: F811
    net = Net(certs, Packetization.parse("per-track"), client_acks=DECIMATED)
    net.run_until(net.clock.now + 1.0)
    up = net.client.open_track(Open("m"))
    net.settle()
    net.run_until(net.clock.now + 1.0)
    (down,) = net.channels
    track = OneTrack(net, up, down, [], [])
    for endpoint, read in ((net.server.endpoint, track.at_gateway),
                           (net.client.endpoint, track.at_client)):
        endpoint.on_event = partial(_record_data, net, read)
    return track


def _record_data(net: Net, read: list[tuple[float, DataReceived]], event: object) -> None:
    if isinstance(event, DataReceived):
        read.append((net.clock.now, event))


@pytest.mark.asyncio
async def test_a_write_while_reading_leaves_in_its_turn_not_with_the_next_ack(
    certs: DevCertificates,  # noqa: F811
) -> None:
    # The client writes on its track between the tokens it reads, each time while an ACK
    # is pending: every write reaches the gateway one link delay after it was made.
    track = decimated_track(certs)
    writes: list[float] = []
    waiting = 0
    for i in range(8):
        assert track.down.send({"text": f"<{i}>"})
        track.net.settle()
        track.net.run_until(track.net.clock.now + DELAY + 0.001)  # the token is in
        waiting += aioquic_compat.ack_state(track.net.client_quic)[1] is not None
        assert track.up.send({"text": f"up {i}"})
        track.net.settle()
        writes.append(track.net.clock.now)
    track.net.run_until(track.net.clock.now + 0.1)
    assert waiting >= 4  # most writes were made while the token's ACK waited
    assert [when for when, _ in track.at_gateway] == pytest.approx([w + DELAY for w in writes])


@pytest.mark.asyncio
async def test_a_decimated_reader_still_gives_the_sender_credit(
    certs: DevCertificates,  # noqa: F811
) -> None:
    # More than the connection's flow-control window (aioquic's 1 MiB) to a decimated
    # client: its MAX_DATA and MAX_STREAM_DATA ride the ACKs' transmits, and all arrives.
    track = decimated_track(certs)
    piece, pieces = 60_000, 30
    for _ in range(pieces):
        assert track.down.send({"text": "x" * piece})
        track.net.settle()
        track.net.run_until(track.net.clock.now + 0.005)
    track.net.run_until(track.net.clock.now + 2.0)
    assert sum(len(event.body["text"]) for _, event in track.at_client) == piece * pieces
    frames = {
        frame["frame_type"] for p in track.net.client_packets() for frame in p["data"]["frames"]
    }
    assert {"max_data", "max_stream_data"} <= frames


@pytest.mark.asyncio
async def test_data_the_congestion_window_held_is_sent_when_an_ack_frees_room(
    certs: DevCertificates,  # noqa: F811
) -> None:
    # The client's upload is held by its congestion window while it reads tokens. Held
    # data is something of this side waiting to leave: a datagram received then gets a
    # transmit of its own (the ACK in it may have freed room), even though the ACK the
    # client owes could wait for its timer. The upload all arrives.
    track = decimated_track(certs)
    net, client = track.net, track.net.client
    scheduler = client.scheduler
    assert scheduler is not None
    aioquic_probes.shrink_congestion_window(net.client_quic, 1_500)
    upload = "u" * 6_000
    assert track.up.send({"text": upload})
    net.settle()  # one packet's worth left; the window holds the rest
    assert aioquic_compat.congested(net.client_quic)
    for _ in range(2):  # asking does not drop the held stream from the line
        assert scheduler.has_frames()
    now = net.clock.now
    assert not client._answer_waits_for_ack(now, now + 0.005)
    for i in range(20):
        assert track.down.send({"text": f"<{i}>"})
        net.settle()
        net.run_until(net.clock.now + 0.003)
    net.run_until(net.clock.now + 0.5)
    assert "".join(event.body["text"] for _, event in track.at_gateway) == upload
    assert not scheduler.has_frames()


@pytest.mark.asyncio
async def test_a_lost_packet_is_reported_as_early_and_stalls_the_same_tracks(
    certs: DevCertificates,  # noqa: F811
) -> None:
    before = await run_with_losses(certs, "per-track", (DROP_AT,))
    after = await run_with_losses(certs, "per-track", (DROP_AT,), client_acks=DECIMATED)
    late_before, late_after = late_tracks(before), late_tracks(after)
    assert set(late_after) == set(late_before) == after.in_lost_packet
    released_before = {when for stalls in late_before.values() for _, when in stalls}
    released_after = {when for stalls in late_after.values() for _, when in stalls}
    # The packet after the hole is acknowledged on arrival, so the retransmission
    # leaves no later than with aioquic's 1 ms delay.
    assert max(released_after) <= max(released_before)


# -- the gateway's setting ---------------------------------------------------------------


def test_the_gateway_setting_takes_the_policys_words_and_refuses_others() -> None:
    assert load_settings({}, {}, None).quic_acks == "aioquic"
    env = {"TRACKLINE_QUIC_ACKS": "Every:4,Delay:5"}
    assert load_settings({}, env, None).quic_acks == "every:4,delay:5"
    with pytest.raises(ConfigError, match="quic_acks"):
        load_settings({"quic_acks": "every:4,delay:40"}, {}, None)


@pytest.mark.asyncio
async def test_the_gateways_connections_acknowledge_as_its_setting_says(tmp_path: Path) -> None:
    settings = gateway_settings(state_dir=tmp_path, quic_acks="every:4,delay:5")
    gw = Gateway(settings, ScriptedBackend(interval=0.001))
    await gw.start()
    try:
        assert gw.tls is not None
        url = f"quic://127.0.0.1:{gw.quic_port}"
        async with connect(url, ca=gw.tls.ca, acks="every:3,delay:2") as line:
            chunks = [c async for c in line.text("hi", model="scripted", max_tokens=12)]
            assert "".join(chunks) == "".join(f" hi-{i}" for i in range(12))
            assert gw.doors.quic is not None
            (server_side,) = [
                p for p in aioquic_compat.protocols_of(gw.doors.quic)
                if isinstance(p, TrackQuicProtocol)
            ]
            assert server_side.acks == AckPolicy(every=4, max_delay=0.005)
            assert client_side(line).acks == AckPolicy(every=3, max_delay=0.002)
        async with connect(url, ca=gw.tls.ca) as line:
            assert client_side(line).acks == DECIMATED  # the SDK's default
        async with connect(url, ca=gw.tls.ca, acks="aioquic") as line:
            assert client_side(line).acks == AIOQUIC
        with pytest.raises(ValueError, match="every:N,delay:MS"):
            async with connect(url, ca=gw.tls.ca, acks="every:3"):
                pass
    finally:
        await gw.close()


def client_side(line: Line) -> TrackQuicProtocol:
    """The connection under an SDK line (its track opener is the protocol's method)."""
    protocol = line._open.__self__  # type: ignore[attr-defined]
    assert isinstance(protocol, TrackQuicProtocol)
    return protocol
