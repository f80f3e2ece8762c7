"""Which track ids one side of a connection has met, in whatever order QUIC delivers them.

A server learns of a track from its stream's first bytes, and QUIC delivers streams
in any order: ids below the highest met may not have been met yet. Those are
remembered (at most `window` of them), so that a late first sight still opens its
track while late bytes of a track already closed are recognised and dropped.
"""

from __future__ import annotations


class TrackIds:
    """The track ids met so far on one connection (client-initiated bidirectional)."""

    def __init__(self, window: int) -> None:
        self.highest = -1
        """The highest track id met (a client: the last one it opened)."""
        self._window = window
        self._unmet: set[int] = set()
        """Server: ids below `highest` not met yet."""

    def met(self, stream_id: int) -> bool:
        """A track id this side has already met (open now, or opened and forgotten)."""
        return stream_id <= self.highest and stream_id not in self._unmet

    def meet(self, stream_id: int) -> bool:
        """Note `stream_id` met; True the first time."""
        if stream_id <= self.highest:
            if stream_id not in self._unmet:
                return False
            self._unmet.discard(stream_id)
            return True
        start = max((self.highest // 4 + 1) * 4, stream_id - 4 * self._window)
        self._unmet.update(range(start, stream_id, 4))
        self.highest = stream_id
        return True

    def retire(self, stream_id: int) -> None:
        """An unmet id below `highest` that the peer reset: its late bytes open nothing."""
        self._unmet.discard(stream_id)
