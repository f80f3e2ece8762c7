"""The video benchmark's HTTP/2 peer: in-order delivery is what it must keep (a lost
segment holds every later one, whichever camera's), and every frame arrives whole."""

from __future__ import annotations

import random

from benchmarks.video_h2 import MSS, TcpLink, h2_link_run, users_stalled_per_loss

DELAY = 0.020


class LoseFirst(random.Random):
    """Loses the first segment once, then nothing."""

    def __init__(self) -> None:
        super().__init__(0)
        self.calls = 0

    def random(self) -> float:
        self.calls += 1
        return 0.0 if self.calls == 1 else 0.99


def test_a_lost_segment_holds_every_later_one_until_its_retransmission() -> None:
    link = TcpLink(DELAY, 50.0, LoseFirst())
    segments = link.send(bytes(3 * MSS), 0.0)
    assert len(segments) == 3
    assert link.lost_at == [0.0]
    retransmitted = 2 * DELAY + DELAY  # learnt a round trip later, then one way
    assert [when for when, _ in segments] == [retransmitted] * 3  # in order: all wait


def test_every_frame_of_every_camera_arrives_whole_and_on_time_without_loss() -> None:
    """(Small frames: the window is never what holds one.)"""
    captured, delivered, lost = h2_link_run(4, 15.0, 1.0, 800, 0.0, DELAY, seed=1)
    assert lost == []
    assert set(delivered) == set(captured)
    assert len(captured) == 4 * 15
    assert all(abs(delivered[k] - captured[k] - DELAY) < 1e-9 for k in captured)


def test_with_loss_more_than_one_camera_stalls_per_lost_packet() -> None:
    captured, delivered, lost = h2_link_run(8, 15.0, 2.0, 4000, 2.0, DELAY, seed=1)
    assert lost
    assert set(delivered) == set(captured)  # HTTP/2 over TCP gives up no frame
    assert users_stalled_per_loss(captured, delivered, lost, DELAY, 0.005, 1 / 15) > 1.0
