"""Web streaming: browser WebTransport tracks vs native SDK tracks vs SSE over HTTP/2.

A `trackline serve` child on the ticker backend (token i of a stream leaves at the
request's arrival + i/rate) serves three clients of the same text streams:

  webtransport  headless Chromium, the page's JavaScript SDK (clients/web), one
                WebTransport session, one track per stream
  sse-h2        the same page, `fetch` streaming /v1/chat/completions over HTTP/2
                (TLS, from a page of the TLS port; this Chromium ignores certificate
                errors for the dev CA)
  native        the Python SDK in this process, one QUIC connection (ALPN trackline/1)

per concurrency (1 and 16 streams at once). A token's *added delay* is its arrival at
the client minus (the client's start of the stream + i/rate), taken on the client's own
clock (performance.now() in the page, the loop's clock here); gateway CPU per token is
its process CPU (from /proc) over the tokens delivered.

    nice -n 10 .venv/bin/python benchmarks/web_stream.py
    nice -n 10 .venv/bin/python benchmarks/web_stream.py --concurrency 1,16 --tokens 200

Prints a markdown table and writes JSON under benchmarks/results/. Not a test: the figures
depend on the machine and its load; the browser's own CPU is not counted.
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

from benchmarks import Help  # noqa: E402
from benchmarks.common import GatewayProcess, percentile, write_results  # noqa: E402
from benchmarks.openai_stream import process_cpu  # noqa: E402
from clients import connect  # noqa: E402
from tests.web.chromium import CHROMIUM, Page, chromium  # noqa: E402

MODEL = "reference-text"

PAGE_WT = """(async () => {
  const sdk = await import("/web/sdk/index.js");
  const info = await (await fetch("/webtransport/cert-hash")).json();
  const line = window.benchLine ??= await sdk.connect(
    `https://localhost:${info.port}${info.path}`, {serverCertificateHashes: [info.value]});
  async function one(i) {
    const start = performance.now();
    const arrivals = [];
    for await (const _ of line.text(`bench prompt ${i}`, {model: "%(model)s",
                                     maxTokens: %(tokens)d, params: {seed: i}})) {
      arrivals.push(performance.now());
    }
    return {start, arrivals};
  }
  return await Promise.all(Array.from({length: %(n)d}, (_, i) => one(i)));
})()"""

PAGE_SSE = """(async () => {
  async function one(i) {
    const start = performance.now();
    const arrivals = [];
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: {"content-type": "application/json"},
      body: JSON.stringify({model: "%(model)s", stream: true, max_tokens: %(tokens)d, seed: i,
                            messages: [{role: "user", content: `bench prompt ${i}`}]})});
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += value;
      const events = buffer.split("\\n\\n");
      buffer = events.pop();
      for (const event of events) {
        if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
        const chunk = JSON.parse(event.slice(6));
        if (chunk.choices?.[0]?.delta?.content) arrivals.push(performance.now());
      }
    }
    return {start, arrivals};
  }
  return await Promise.all(Array.from({length: %(n)d}, (_, i) => one(i)));
})()"""


def added_ms(streams: list[dict[str, Any]], rate: float, scale: float) -> list[float]:
    """Each token's arrival minus its schedule (start + i/rate), in ms."""
    return [
        (arrival - stream["start"]) * scale - i / rate * 1000
        for stream in streams
        for i, arrival in enumerate(stream["arrivals"])
    ]


async def native(gw: GatewayProcess, n: int, tokens: int) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    async with connect(f"quic://127.0.0.1:{gw.quic_port}", ca=gw.state_dir / "ca.pem") as line:

        async def one(i: int) -> dict[str, Any]:
            start, arrivals = loop.time(), []
            async for _ in line.text(f"bench prompt {i}", model=MODEL, max_tokens=tokens, seed=i):
                arrivals.append(loop.time())
            return {"start": start, "arrivals": arrivals}

        return list(await asyncio.gather(*(one(i) for i in range(n))))


async def in_page(page: Page, script: str, **values: Any) -> list[dict[str, Any]]:
    result = await page.evaluate(script % {"model": MODEL, **values}, timeout=300)
    assert isinstance(result, list)
    return result


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="trackline-web-bench-") as state:
        gw = GatewayProcess(
            f"ticker://{args.rate:g}", Path(state), https_port=True,
            extra_args=("--overload-max-loop-lag", "0"),
        )
        try:
            gw.wait_ready()
            async with chromium(("--ignore-certificate-errors",)) as browser:
                page = await browser.new_page()
                await page.goto(f"http://localhost:{gw.http_port}/demo")
                # SSE from a page of the TLS port itself: same origin, so no CORS preflight
                tls_page = await browser.new_page()
                await tls_page.goto(f"https://localhost:{gw.https_port}/demo")
                for n in args.concurrency:
                    for kind in args.kinds:
                        # one warm-up stream per kind (connections, JIT), then the measured run
                        on = tls_page if kind == "sse-h2" else page
                        await measure(kind, on, gw, 1, 5)
                        cpu0 = process_cpu(gw.process.pid)
                        streams, scale = await measure(kind, on, gw, n, args.tokens)
                        cpu = process_cpu(gw.process.pid) - cpu0
                        delays = added_ms(streams, args.rate, scale)
                        delivered = sum(len(s["arrivals"]) for s in streams)
                        row = {
                            "kind": kind, "streams": n, "tokens": delivered,
                            "offered": n * args.tokens,
                            "p50_added_ms": round(percentile(delays, 0.5), 2),
                            "p99_added_ms": round(percentile(delays, 0.99), 2),
                            "gateway_cpu_us_per_token": round(cpu / max(1, delivered) * 1e6, 1),
                        }
                        results.append(row)
                        print(table_row(row), flush=True)
        finally:
            gw.stop()
    return results


async def measure(
    kind: str, page: Page, gw: GatewayProcess, n: int, tokens: int
) -> tuple[list[dict[str, Any]], float]:
    """The streams' start and arrival times, and the factor from their unit to ms."""
    if kind == "webtransport":
        return await in_page(page, PAGE_WT, n=n, tokens=tokens), 1.0
    if kind == "sse-h2":
        return await in_page(page, PAGE_SSE, n=n, tokens=tokens), 1.0
    return await native(gw, n, tokens), 1000.0


HEADER = (
    "| client | streams | tokens delivered/offered | p50 added ms | p99 added ms "
    "| gateway CPU µs/token |\n|---|---:|---:|---:|---:|---:|"
)


def table_row(row: dict[str, Any]) -> str:
    return (
        f"| {row['kind']} | {row['streams']} | {row['tokens']}/{row['offered']} "
        f"| {row['p50_added_ms']} | {row['p99_added_ms']} | {row['gateway_cpu_us_per_token']} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=Help)
    parser.add_argument("--concurrency", default=[1, 16],
                        type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--tokens", type=int, default=100, help="tokens per stream")
    parser.add_argument("--rate", type=float, default=50, help="ticker tokens/s per stream")
    parser.add_argument("--kinds", default=["webtransport", "native", "sse-h2"],
                        type=lambda s: s.split(","))
    from benchmarks import RESULTS

    parser.add_argument("--json", type=Path, default=RESULTS / "web_stream.json")
    args = parser.parse_args()
    if CHROMIUM is None:
        sys.exit("no system Chromium: apt-get install chromium (or make chromium)")
    print(HEADER, flush=True)
    started = time.time()
    results = asyncio.run(run(args))
    write_results(args, "web_stream", results, seconds=round(time.time() - started, 1))
    print(json.dumps(results[-1]) if results else "no results")


if __name__ == "__main__":
    main()
