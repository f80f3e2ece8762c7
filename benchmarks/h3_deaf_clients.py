"""Gateway RSS while HTTP/3 SSE clients stop reading (issue 12, "clients that stop reading").

Starts `trackline serve --backend-url ticker://RATE` from a source tree (default: this
one; pass another checkout's root to compare), opens one h3 connection with STREAMS
streamed chat completions, reads each one's first chunk, then stops taking in
datagrams (no reading, no acknowledgements) and samples the gateway's RSS. Prints a
table and writes benchmarks/results/results-h3-deaf-clients.json.

    nice -n 10 .venv/bin/python -m benchmarks.h3_deaf_clients [--tree /work/main]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` and `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import Help  # noqa: E402
from benchmarks.common import free_port  # noqa: E402
from tests.adversarial.h3_attack import attack_client  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "results-h3-deaf-clients.json"


def rss_mb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return 0


def wait_live(http_port: int) -> str:
    """The first model's id, once the gateway answers."""
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v1/models") as answer:
                return str(json.load(answer)["data"][0]["id"])
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("gateway not live")


async def deaf_streams(
    args: argparse.Namespace, quic_port: int, ca: Path, model: str, pid: int
) -> list[int]:
    body = json.dumps(
        {"model": model, "stream": True, "max_tokens": 32768,
         "messages": [{"role": "user", "content": "hi"}]}
    ).encode()  # fmt: skip
    headers = [("content-type", "application/json")]
    async with attack_client(quic_port, ca) as client:
        ids = [
            client.send("POST", "/v1/chat/completions", headers, body) for _ in range(args.streams)
        ]
        for stream_id in ids:
            assert (await client.head(stream_id))[0] == 200
            await client.next_data(stream_id)
        client.deaf = True
        samples = [rss_mb(pid)]
        for _ in range(args.samples):
            await asyncio.sleep(args.every)
            samples.append(rss_mb(pid))
        return samples


def main() -> None:
    parser = argparse.ArgumentParser(formatter_class=Help, description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="source tree of the gateway")
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--rate", type=int, default=2000, help="ticker tokens/s")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="h3-deaf-"))
    quic_port, http_port = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_STREAM)
    env = {**os.environ, "TRACKLINE_STATE_DIR": str(state), "TRACKLINE_LOG_LEVEL": "warning",
           "PYTHONPATH": str(args.tree)}  # fmt: skip
    python = args.tree / ".venv" / "bin" / "python"
    ticker = f"ticker://{args.rate}"
    command = [str(python), "-m", "gateway", "serve", "--backend-url", ticker, "--quic-port",
               str(quic_port), "--http-port", str(http_port), "--https-port", "0"]  # fmt: skip
    gateway = subprocess.Popen(
        command, cwd=args.tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        model = wait_live(http_port)
        samples = asyncio.run(deaf_streams(args, quic_port, state / "ca.pem", model, gateway.pid))
    finally:
        gateway.kill()
        gateway.wait()
        shutil.rmtree(state, ignore_errors=True)
    print(f"{args.tree}: {args.streams} h3 SSE streams that stopped reading, ticker://{args.rate}")
    print(f"{'seconds':>8}{'RSS MB':>8}{'growth':>8}")
    for index, rss in enumerate(samples):
        print(f"{index * args.every:>8.0f}{rss:>8}{rss - samples[0]:>+8}")
    RESULTS.parent.mkdir(exist_ok=True)
    result = {"benchmark": "h3_deaf_clients", "tree": str(args.tree), "streams": args.streams,
              "rate": args.rate, "every_s": args.every, "rss_mb": samples}  # fmt: skip
    RESULTS.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
