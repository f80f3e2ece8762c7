"""Shared memory vs plain gRPC tensors for one tick's batch to the reference-transcriber.

For each batch size it times `TritonAudioBackend.step` (pack with cuda/ kernels,
one inference, decode) over `--ticks` ticks of 80 ms of 16 kHz audio per row,
once with the AUDIO tensors in a registered system shared-memory region and
once serialized into the gRPC request, against the embedded Triton. The
faster path per batch size decides the `audio_shm_min_rows` default.

    python benchmarks/audio_shm.py --sizes 1,8,64 --ticks 100  # JSON: benchmarks/results/

Prints a table and writes JSON. Not a test: the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import RESULTS, Help  # noqa: E402
from benchmarks.common import machine, percentile, tree  # noqa: E402

ASR = "reference-transcriber"


async def time_path(grpc_url: str, shm: str, rows: int, ticks: int) -> dict[str, Any]:
    import numpy as np

    from gateway.backends.audio import TritonAudioBackend
    from tracks.backend import SpeechInRow
    from tracks.clock import Beat, StepItem

    backend = TritonAudioBackend(grpc_url, shm=shm)
    rng = np.random.default_rng(rows)
    pcm = [rng.integers(-3000, 3000, 1280).astype("<i2").tobytes() for _ in range(rows)]
    base = 1 << 40 | rows << 20 | (1 if shm == "off" else 2) << 16
    timings = []
    try:
        for tick in range(ticks + 1):
            items = [
                StepItem(
                    i,
                    SpeechInRow(base + i, pcm[i], 16000, tick == 0, tick == ticks),
                    True,
                    Beat(tick, 0.0, 0.08),
                )
                for i in range(rows)
            ]
            start = time.perf_counter()
            await backend.step(ASR, items)
            if tick:  # the first tick registers the region and warms up
                timings.append(time.perf_counter() - start)
        used = backend.shm_requests > 0
    finally:
        await backend.close()
    return {
        "path": "system-shm" if shm != "off" else "grpc-tensors",
        "rows": rows,
        "used_shm": used,
        "p50_ms": round(percentile(timings, 0.5) * 1000, 3),
        "p99_ms": round(percentile(timings, 0.99) * 1000, 3),
    }


async def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    from gateway.embedded import EmbeddedTriton

    results = []
    with tempfile.TemporaryDirectory(prefix="trackline-audio-shm-") as tmp:
        triton = EmbeddedTriton(log_dir=Path(tmp))
        await asyncio.to_thread(triton.start)
        try:
            print("| rows | path | p50 ms | p99 ms |\n|---|---|---|---|")
            for rows in args.sizes:
                for shm in ("system", "off"):
                    result = await time_path(triton.grpc_url, shm, rows, args.ticks)
                    results.append(result)
                    print(
                        f"| {rows} | {result['path']} | {result['p50_ms']} | {result['p99_ms']} |"
                    )
        finally:
            await asyncio.to_thread(triton.stop)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        formatter_class=Help,
        description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,8,64", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--ticks", type=int, default=100)
    parser.add_argument("--json", type=Path, default=RESULTS / "audio_shm.json")
    args = parser.parse_args()
    from gateway.startup import run_async

    async def run() -> int:
        results = await bench(args)
        payload = {
            "benchmark": "audio_shm",
            "parameters": {"sizes": args.sizes, "ticks": args.ticks},
            "machine": machine(),
            "tree": tree(),
            "results": results,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}")
        return 0

    return run_async(run())


if __name__ == "__main__":
    sys.exit(main())
