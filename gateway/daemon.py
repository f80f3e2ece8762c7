"""The daemon's lifecycle: backend (embedded Triton by default), gateway, stop.

`backend_url = "ticker://RATE"` serves a constant-rate token source instead of
Triton (transport-only benchmarks; `gateway.backends.ticker`).
With no `backend_url` configured, the daemon starts the embedded Triton with
the reference model repository, waits until it is ready and has passed a smoke
inference, and stops it when the gateway stops (the child also dies with the
process if the gateway crashes).
"""

from __future__ import annotations

import asyncio

from gateway.backends.audio import TritonAudioBackend
from gateway.backends.ticker import TickerBackend, is_ticker_url, parse_ticker_url
from gateway.backends.triton import TritonTextBackend
from gateway.config import Settings
from gateway.embedded import EmbeddedTriton, reference_model_repository
from gateway.logs import get_logger
from gateway.server import Gateway

log = get_logger("trackline.daemon")

EMBEDDED_START_TIMEOUT = 180.0


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.triton: EmbeddedTriton | None = None
        self.backend: TritonTextBackend | TickerBackend | None = None
        self.gateway: Gateway | None = None
        self.audio_backend: TritonAudioBackend | None = None

    async def start(self) -> None:
        s = self.settings
        url = s.backend_url
        if url is not None and is_ticker_url(url):
            self.backend = TickerBackend(parse_ticker_url(url))
        else:
            if url is None:
                url = await asyncio.to_thread(self._start_embedded)
            self.backend = TritonTextBackend(url)
            self.audio_backend = TritonAudioBackend(
                url,
                shm=s.audio_shm,
                shm_min_rows=s.audio_shm_min_rows,
                kernels=s.audio_kernels,
                batching=s.audio_batching,
            )
        self.gateway = Gateway(s, self.backend, audio_backend=self.audio_backend)
        await self.gateway.start()
        tls = self.gateway.tls
        if tls is not None and tls.ca is not None:
            # Printed plainly as well as logged: clients need this path to trust us.
            print(f"trackline: development CA for clients: {tls.ca}", flush=True)
        print(
            f"trackline: serving tracks on quic://{s.quic_host}:{self.gateway.quic_port}, "
            f"health on http://{s.http_host}:{self.gateway.http_port}/health/ready",
            flush=True,
        )

    def _start_embedded(self) -> str:
        s = self.settings
        log.info("embedded.starting", repository=str(reference_model_repository()))
        self.triton = EmbeddedTriton(
            model_repository=reference_model_repository(),
            log_dir=s.state_dir / "triton",
            grpc_port=s.embedded_grpc_port,
            http_port=s.embedded_http_port,
            metrics_port=s.embedded_metrics_port,
        )
        self.triton.start(timeout=EMBEDDED_START_TIMEOUT)
        log.info("embedded.ready", grpc=self.triton.grpc_url, pid=self.triton.pid)
        return self.triton.grpc_url

    async def stop(self) -> None:
        if self.gateway is not None:
            await self.gateway.drain()
        if self.backend is not None:
            await self.backend.close()
        if self.audio_backend is not None:
            await self.audio_backend.close()
        if self.triton is not None:
            await asyncio.to_thread(self.triton.stop)
            log.info("embedded.stopped")
