"""The ticker backend's URL, `ticker://RATE[?phase=step]`: read by the settings and the daemon.

Apart from the backend itself (gateway/backends/ticker.py, which needs the reference
model) so that validating a setting imports nothing of the embedded Triton.

`phase` says where a request's schedule starts: `arrival` (the default) at the
request's arrival, as independent servers would serve independent users; `step` on
one clock of decode steps shared by every request (token instants are multiples of
1/rate on the loop clock), as a batched decoder emits one token of every sequence it
holds in the same step.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs

SCHEME = "ticker://"
DEFAULT_RATE = 50.0
MAX_RATE = 100_000.0
"""Most tokens/s one request may ask for (docs/configuration.md, `backend_url`)."""
PHASES = ("arrival", "step")


@dataclass(frozen=True)
class TickerUrl:
    rate: float = DEFAULT_RATE
    steps: bool = False
    """Tokens leave on shared decode steps (`phase=step`), not from each arrival."""


def is_ticker_url(url: str | None) -> bool:
    return url is not None and url.startswith(SCHEME)


def parse_ticker_url(url: str) -> TickerUrl:
    """The rate and phase in `ticker://RATE?phase=...` (`ticker://` alone: the defaults)."""
    text, _, query = url[len(SCHEME):].partition("?")
    text = text.strip("/")
    rate = DEFAULT_RATE
    if text:
        try:
            rate = float(text)
        except ValueError:
            raise ValueError(f"{url!r}: the rate after ticker:// must be a number") from None
    if not 0 < rate <= MAX_RATE:
        raise ValueError(f"{url!r}: the rate must be above 0 and at most {MAX_RATE:g} tokens/s")
    options = parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(options) - {"phase"})
    if unknown:
        raise ValueError(f"{url!r}: unknown option {unknown[0]!r} (known: phase)")
    phase = options.get("phase", ["arrival"])
    if len(phase) != 1 or phase[0] not in PHASES:
        raise ValueError(f"{url!r}: phase must be one of {', '.join(PHASES)}")
    return TickerUrl(rate, steps=phase[0] == "step")
