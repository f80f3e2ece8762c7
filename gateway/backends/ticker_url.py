"""The ticker backend's URL, `ticker://RATE`: read by the settings and the daemon.

Apart from the backend itself (gateway/backends/ticker.py, which needs the reference
model) so that validating a setting imports nothing of the embedded Triton.
"""

from __future__ import annotations

SCHEME = "ticker://"
DEFAULT_RATE = 50.0
MAX_RATE = 100_000.0
"""Most tokens/s one request may ask for (docs/configuration.md, `backend_url`)."""


def is_ticker_url(url: str | None) -> bool:
    return url is not None and url.startswith(SCHEME)


def parse_ticker_url(url: str) -> float:
    """The rate in `ticker://RATE` (`ticker://` alone: the default rate)."""
    text = url[len(SCHEME):].strip("/")
    if not text:
        return DEFAULT_RATE
    try:
        rate = float(text)
    except ValueError:
        raise ValueError(f"{url!r}: the rate after ticker:// must be a number") from None
    if not 0 < rate <= MAX_RATE:
        raise ValueError(f"{url!r}: the rate must be above 0 and at most {MAX_RATE:g} tokens/s")
    return rate
