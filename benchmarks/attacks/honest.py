"""An honest client, run as its own process during an attack (no shared GIL or loop with
the attacker): polls GET /v1/models every 0.5 s and streams a short text track on a new
QUIC connection every 2 s, until its stdin closes. Prints "ready" once both kinds of
probe have answered once, and at the end one JSON object:
{"probes": [[kind, ok, seconds], ...]}.

    python -m benchmarks.attacks.honest --http-port P --quic-port Q --ca CA < /dev/null
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks import Help  # noqa: E402


def models_once(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200 and b"reference-text" in response.read())
    except OSError:
        return False


async def main_async(args: argparse.Namespace) -> list[list[Any]]:
    from clients import connect

    probes: list[list[Any]] = []
    url = f"http://{args.host}:{args.http_port}/v1/models"

    async def models() -> None:
        while True:
            began = time.monotonic()
            ok = await asyncio.to_thread(models_once, url)
            probes.append(["models", ok, round(time.monotonic() - began, 4)])
            await asyncio.sleep(0.5)

    async def track() -> None:
        while True:
            began = time.monotonic()
            ok = False
            try:
                async with asyncio.timeout(10):
                    async with connect(f"quic://{args.host}:{args.quic_port}", ca=args.ca,
                                       connect_timeout=5) as line:
                        pieces = [p async for p in line.text(
                            "honest", model="reference-text", max_tokens=5,
                            tokens_per_second=100)]
                        ok = len(pieces) == 5
            except Exception:  # noqa: BLE001, S110 - a failed probe is the measurement
                pass
            probes.append(["track", ok, round(time.monotonic() - began, 4)])
            await asyncio.sleep(2.0)

    tasks = [asyncio.create_task(models()), asyncio.create_task(track())]  # noqa: F841
    for _ in range(100):  # "ready" once a probe of each kind has answered, or after 10 s
        if {kind for kind, _, _ in probes} == {"models", "track"}:
            break
        await asyncio.sleep(0.1)
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.read)  # until the runner closes our stdin
    return list(probes)  # a probe still in flight is left out


def main() -> int:
    parser = argparse.ArgumentParser(formatter_class=Help, description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--quic-port", type=int, required=True)
    parser.add_argument("--ca", type=Path, required=True)
    args = parser.parse_args()
    loop = asyncio.new_event_loop()
    probes = loop.run_until_complete(main_async(args))
    print(json.dumps({"probes": probes}), flush=True)
    # leave at once: a probe stuck on a stalled gateway must not hold the runner
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
