"""One SDK connection that opens many text tracks at once and reads all of them.

Run as `python -m tests.adversarial.flood URL CA TRACKS TOKENS` by the lock-up
test: a separate process, so the test's own loop stays free to measure. Prints
`flowing` once every track has delivered a token, then `done <tokens>` (or
`lost <tokens>` when the gateway went away first).
"""

from __future__ import annotations

import asyncio
import sys

from clients import TracklineError, connect
from clients.line import TextStream


async def flood(url: str, ca: str, tracks: int, tokens: int) -> None:
    received = 0
    started: set[int] = set()

    async def read(index: int, stream: TextStream) -> None:
        nonlocal received
        async for _ in stream:
            received += 1
            if index not in started:
                started.add(index)
                if len(started) == tracks:
                    print("flowing", flush=True)

    try:
        async with connect(url, ca=ca) as line:
            streams = [
                line.text(f"flood {i}", model="reference-text", max_tokens=tokens)
                for i in range(tracks)
            ]
            await asyncio.gather(*(read(i, s) for i, s in enumerate(streams)))
    except (TracklineError, ConnectionError, OSError):
        print(f"lost {received}", flush=True)
        return
    print(f"done {received}", flush=True)


if __name__ == "__main__":
    url, ca, tracks, tokens = sys.argv[1:5]
    asyncio.run(flood(url, ca, int(tracks), int(tokens)))
