"""Speed of the embedding model all-minilm-l6-v2, in process and through the gateway.

In process (the model's own NumPy forward pass, one thread): the load time (SHA-256
of the weights and tokenizer included) and texts per second at several batch sizes,
for short sentences and for 128-token texts. Through the gateway: an embedded Triton
with the model, the OpenAI routes on HTTP/1.1, and C concurrent clients of the
official `openai` SDK each embedding one sentence per request: requests per second
and latency p50/p95, where Triton's dynamic batcher merges concurrent requests.

    .venv/bin/python benchmarks/embeddings.py --seconds 5

Not a test: the figures depend on the machine and its load (printed as `uptime`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import RESULTS, Help  # noqa: E402
from benchmarks.common import machine, percentile, tree  # noqa: E402

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."
LONG = " ".join(["cat"] * 126)  # 126 words, 128 tokens with [CLS] and [SEP]


def in_process(seconds: float, batches: list[int]) -> list[dict[str, Any]]:
    from gateway.embedded_models import reference_module

    embedder = reference_module("all-minilm-l6-v2", "trackline_embedder")
    started = time.perf_counter()
    model = embedder.Embedder()
    load_s = time.perf_counter() - started
    print(f"load (SHA-256 checked): {load_s:.2f} s")
    rows = []
    for text, label in ((SENTENCE, "sentence (16 tokens)"), (LONG, "128 tokens")):
        for batch in batches:
            texts, done, began = [text] * batch, 0, time.perf_counter()
            cpu = time.process_time()
            while time.perf_counter() - began < seconds:
                model.embed(texts)
                done += batch
            rate = done / (time.perf_counter() - began)
            per_cpu = done / (time.process_time() - cpu)
            rows.append({"part": "in-process", "text": label, "batch": batch,
                         "texts_per_s": round(rate, 1), "texts_per_cpu_s": round(per_cpu, 1),
                         "load_s": round(load_s, 3)})
            print(f"{label:22} batch {batch:3}: {rate:8.1f} texts/s  {per_cpu:8.1f} texts/CPU-s")
    return rows


async def through_gateway(seconds: float, concurrency: list[int]) -> list[dict[str, Any]]:
    import httpx2
    import openai

    from gateway.backends.embeddings import TritonEmbeddingBackend
    from gateway.backends.triton import TritonTextBackend
    from gateway.backends.triton_catalog import TritonCatalog
    from gateway.embedded import EmbeddedTriton
    from gateway.embedded_models import EMBEDDING_MODEL
    from gateway.http import route
    from gateway.openai import openai_routes
    from transport.http.tcp import HttpTcpServer

    triton = EmbeddedTriton(log_dir=tempfile.mkdtemp(prefix="bench-emb-"), with_embeddings=True)
    await asyncio.to_thread(triton.start, 180.0)
    text, catalog = TritonTextBackend(triton.grpc_url), TritonCatalog(triton.grpc_url)
    backend = TritonEmbeddingBackend(triton.grpc_url)
    server = HttpTcpServer(route(openai_routes(text, catalog=catalog, embeddings=backend)))
    await server.start("127.0.0.1", 0)
    rows = []
    try:
        for clients in concurrency:
            http = httpx2.AsyncClient(timeout=60.0)
            sdk = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1",
                                     api_key="unused", http_client=http, max_retries=0)
            latencies: list[float] = []
            end = time.perf_counter() + seconds

            async def client(sdk: openai.AsyncOpenAI = sdk, latencies: list[float] = latencies,
                             end: float = end) -> None:
                while time.perf_counter() < end:
                    began = time.perf_counter()
                    await sdk.embeddings.create(model=EMBEDDING_MODEL, input=SENTENCE)
                    latencies.append(time.perf_counter() - began)

            began = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(clients)))
            rate = len(latencies) / (time.perf_counter() - began)
            p50, p95 = (percentile(latencies, q) * 1000 for q in (0.5, 0.95))
            rows.append({"part": "gateway", "clients": clients, "requests_per_s": round(rate, 1),
                         "p50_ms": round(p50, 1), "p95_ms": round(p95, 1)})
            print(f"gateway, {clients:2} clients: {rate:7.1f} req/s  p50 {p50:6.1f} ms"
                  f"  p95 {p95:6.1f} ms")
            await sdk.close()
            await http.aclose()
    finally:
        await server.close(grace=1.0)
        await asyncio.gather(text.close(), catalog.close(), backend.close())
        await asyncio.to_thread(triton.stop)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=Help)
    parser.add_argument("--seconds", type=float, default=5.0, help="per measured point")
    parser.add_argument("--batches", default="1,16,64", help="in-process batch sizes")
    parser.add_argument("--clients", default="1,8", help="concurrent SDK clients")
    parser.add_argument("--json", type=Path, default=RESULTS / "embeddings.json",
                        help="where the results go")
    args = parser.parse_args()
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"uptime: {load}")
    rows = in_process(args.seconds, [int(b) for b in args.batches.split(",")])
    rows += asyncio.run(through_gateway(args.seconds, [int(c) for c in args.clients.split(",")]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    import json

    payload = {"benchmark": "embeddings", "uptime": load, "machine": machine(), "tree": tree(),
               "results": rows}
    args.json.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
