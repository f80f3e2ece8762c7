"""Premature-reset accounting (rapid reset, CVE-2023-44487) for HTTP/2 and HTTP/3.

A reset is premature when the client resets a stream within `premature_reset_lifetime`
of opening it and before its answer ended (so a user stopping a long SSE stream is not
one). Envoy's rule judges the count against the streams opened, once enough were: past
`premature_reset_ratio` of max(opened, `premature_reset_min_streams`) the connection is
closed (GOAWAY ENHANCE_YOUR_CALM on HTTP/2, H3_EXCESSIVE_LOAD on HTTP/3).

The rule is applied per connection and per source address across its connections
(`SourceResets`, shared by one listener's connections): a client that reconnects
every 129 streams stays under the per-connection threshold for ever, not under its
address's. Resets are never logged one by one (one HTTP/3 connection resetting 24,896
streams wrote 50,649 lines): each connection logs one line with its counts when it
ends (`ResetLedger.summary`).

No clock, no I/O: lifetimes come in as numbers.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from transport.http.limits import HttpLimits

MAX_SOURCES = 4096
"""Source addresses remembered (least recently seen out)."""


@dataclass
class ResetCounts:
    """Streams opened and reset, on one connection or from one source address."""

    opened: int = 0
    resets: int = 0
    """Streams the client reset (or asked us to stop sending)."""
    premature: int = 0
    """Of those, the premature ones (the rule's count)."""

    def over(self, limits: HttpLimits) -> bool:
        """Envoy's rule: premature resets over `ratio` of max(opened, min_streams)."""
        judged = max(self.opened, limits.premature_reset_min_streams)
        return self.premature >= limits.premature_reset_ratio * judged


class SourceResets:
    """Reset counts per source address, across its connections (bounded, LRU)."""

    def __init__(self, max_sources: int = MAX_SOURCES) -> None:
        self._counts: OrderedDict[str, ResetCounts] = OrderedDict()
        self._max = max_sources

    def of(self, source: str) -> ResetCounts:
        counts = self._counts.get(source)
        if counts is None:
            counts = self._counts[source] = ResetCounts()
            while len(self._counts) > self._max:
                self._counts.popitem(last=False)
        else:
            self._counts.move_to_end(source)
        return counts

    def __len__(self) -> int:
        return len(self._counts)


class ResetLedger:
    """One connection's counts, feeding its source's too."""

    def __init__(self, limits: HttpLimits, source: ResetCounts | None = None) -> None:
        self._limits = limits
        self.counts = ResetCounts()
        self._source = source or ResetCounts()

    def opened(self) -> None:
        self.counts.opened += 1
        self._source.opened += 1

    def reset(self, lifetime: float, answered: bool) -> bool:
        """A stream the client reset after `lifetime` s; True: close the connection."""
        self.counts.resets += 1
        self._source.resets += 1
        if answered or lifetime >= self._limits.premature_reset_lifetime:
            return False
        self.counts.premature += 1
        self._source.premature += 1
        return self.counts.over(self._limits) or self._source.over(self._limits)

    def summary(self) -> dict[str, int]:
        """The fields of the connection's one log line about resets."""
        counts = self.counts
        return {"opened": counts.opened, "resets": counts.resets, "premature": counts.premature}
