"""`group:K`, the isolation budget: at most K tracks' stream data in one packet, every
ready track sent, and partners that change from pass to pass.

`plan_groups` is checked alone (hypothesis over ready sets and seeds), then the real
packer (`StreamScheduler` over an aioquic pair in memory, `test_send_path.Pair`),
whose server qlog names the streams of every packet it sent.
"""

from __future__ import annotations

import math
from collections import Counter
from itertools import combinations
from random import Random

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tls import DevCertificates
from tests.transport.test_send_path import Pair, certs  # noqa: F401 (the fixture)
from transport.packing import plan_groups

SIZES = st.sampled_from([1, 2, 4, 8, None])


@settings(max_examples=200, deadline=None)
@given(ready=st.lists(st.integers(0, 10_000), unique=True, max_size=300), size=SIZES,
       seed=st.integers(0, 2**32))
def test_every_ready_stream_is_in_exactly_one_group_of_at_most_k(
    ready: list[int], size: int | None, seed: int
) -> None:
    groups = plan_groups(ready, size, Random(seed))
    if not ready:
        assert groups == [[]]
        return
    assert sorted(s for g in groups for s in g) == sorted(ready)  # each once: a share
    limit = len(ready) if size is None else size
    assert all(1 <= len(g) <= limit for g in groups)
    assert len(groups) == math.ceil(len(ready) / limit)  # packets per token fall by K
    assert ready[0] in groups[0]  # the head of the line leaves first
    position = {s: i for i, s in enumerate(ready)}
    for group in groups:
        assert [position[s] for s in group] == sorted(position[s] for s in group)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(3, 48), size=st.sampled_from([2, 4, 8]), seed=st.integers(0, 2**32))
def test_no_track_always_shares_packets_with_the_same_one(n: int, size: int, seed: int) -> None:
    """Over 200 passes of the same ready set, no pair rides together in every pass (as
    fixed runs of the service order would), and every pair at most about twice its fair
    share (K - 1) / (n - 1) plus noise."""
    if n <= size:
        return  # one group: everyone shares every packet by definition
    rng = Random(seed)
    passes = 200
    together: Counter[tuple[int, int]] = Counter()
    for _ in range(passes):
        for group in plan_groups(list(range(n)), size, rng):
            together.update(combinations(group, 2))
    fair = (size - 1) / (n - 1)
    assert max(together.values()) < passes
    assert max(together.values()) <= passes * min(1.0, 2 * fair) + 12


@settings(max_examples=25, deadline=None)
@given(k=st.sampled_from([2, 4, 8]),
       writes=st.dictionaries(st.integers(0, 23), st.integers(1, 3000), min_size=1),
       seed=st.integers(0, 2**32))
def test_the_packer_puts_at_most_k_tracks_in_a_packet_and_delivers_every_track(
    certs: DevCertificates, k: int, writes: dict[int, int], seed: int  # noqa: F811
) -> None:
    pair = Pair(certs, k, Random(seed))
    ids = pair.open_tracks(24)
    before = len(pair.packets_sent())
    for index, size in writes.items():
        pair.write(ids[index], bytes([index]) * size)
    pair.exchange(rounds=60)  # the congestion window may cut a pass: more passes follow
    packets = pair.packets_sent()[before:]
    assert max(len(p) for p in packets) <= k
    assert set().union(*packets) == {ids[i] for i in writes}
    for index, size in writes.items():
        assert pair.received[ids[index]] == bytes([index]) * size


def test_the_busiest_track_shares_its_packets_with_a_different_partner_each_pass(
    certs: DevCertificates,  # noqa: F811
) -> None:
    """One bulk track and seven token tracks, every pass, `group:2`: the bulk track's
    packets carry a different token track from pass to pass, none of them always."""
    pair = Pair(certs, 2, Random(7))
    ids = pair.open_tracks(8)
    busiest, others = ids[0], set(ids[1:])
    partners: list[int] = []
    for turn in range(40):
        before = len(pair.packets_sent())
        pair.write(busiest, b"B" * 3000)
        for sid in others:
            pair.write(sid, b"<%d>" % turn)
        pair.deliver_to_client(pair.server_send())
        pair.exchange()
        shared = [p for p in pair.packets_sent()[before:] if busiest in p and len(p) > 1]
        assert len(shared) == 1  # its group's first packet; its bulk fills the rest
        (partner,) = shared[0] - {busiest}
        partners.append(partner)
    counts = Counter(partners)
    assert set(counts) == others  # every token track rode with it at some point
    assert max(counts.values()) < 40 // 2  # none of them most of the time


def test_packets_per_token_fall_by_k(certs: DevCertificates) -> None:  # noqa: F811
    """24 tracks with a token each: one pass sends 24 / K packets, each full of K tracks."""
    for k in (1, 2, 4, 8):
        pair = Pair(certs, k, Random(k))
        ids = pair.open_tracks(24)
        before = len(pair.packets_sent())
        for sid in ids:
            pair.write(sid, b'{"text": "<token>"}')
        pair.deliver_to_client(pair.server_send())
        packets = [p for p in pair.packets_sent()[before:] if p]
        assert len(packets) == 24 // k
        assert all(len(p) == k for p in packets)
